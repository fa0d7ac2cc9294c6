"""A GGUF's own Jinja chat template (`tokenizer.chat_template`), rendered as llama-server
does with --jinja and as llama-cpp-python's Jinja2ChatFormatter does: a sandboxed jinja2
environment with trim_blocks and lstrip_blocks, the vocabulary's BOS and EOS texts as
`bos_token` / `eos_token`, `add_generation_prompt`, and the helpers templates call
(`raise_exception`, `strftime_now`, `tojson` as in transformers).

llama.cpp's built-in `llama_chat_apply_template` recognises a template by its look and
applies a fixed C++ rendering of it instead, which leaves out what the template itself adds
(SmolLM2's default system message, for one); the served prompt is the template's own.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Mapping, Sequence

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


class ChatTemplateError(ValueError):
    """The template does not compile, or refuses the conversation (raise_exception)."""


class _IgnoreGenerationTags(jinja2.ext.Extension):
    """HuggingFace's `{% generation %}` tag renders its body (as transformers does)."""
    tags = {"generation"}

    def parse(self, parser):
        parser.stream.skip(1)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _raise_exception(message: str):
    raise ChatTemplateError(message)


def _strftime_now(fmt: str = "%Y-%m-%d") -> str:
    return datetime.now().strftime(fmt)


class ChatTemplate:
    """One compiled template with the vocabulary's special texts."""

    def __init__(self, source: str, bos_token: str, eos_token: str):
        self.source, self.bos_token, self.eos_token = source, bos_token, eos_token
        env = ImmutableSandboxedEnvironment(loader=jinja2.BaseLoader(), trim_blocks=True,
                                            lstrip_blocks=True,
                                            extensions=[_IgnoreGenerationTags,
                                                        jinja2.ext.loopcontrols])
        env.filters["tojson"] = _tojson
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateError as err:
            raise ChatTemplateError(f"the model's chat template does not compile: {err}") \
                from None

    def render(self, messages: Sequence[Mapping[str, Any]],
               add_generation_prompt: bool = True, **context: Any) -> str:
        """The conversation as the prompt's text (ChatTemplateError if the template refuses
        it or fails on it)."""
        variables = dict(context, messages=[dict(m) for m in messages],
                         bos_token=self.bos_token, eos_token=self.eos_token,
                         add_generation_prompt=add_generation_prompt,
                         raise_exception=_raise_exception, strftime_now=_strftime_now)
        try:
            return self._template.render(**variables)
        except ChatTemplateError:
            raise
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError) as err:
            raise ChatTemplateError(f"the model's chat template failed on these messages: "
                                    f"{type(err).__name__}: {err}") from None
