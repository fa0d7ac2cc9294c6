"""A GGUF's own Jinja chat template (`tokenizer.chat_template`), rendered as llama-server
does with --jinja and as llama-cpp-python's Jinja2ChatFormatter does: a sandboxed jinja2
environment with trim_blocks and lstrip_blocks, the vocabulary's BOS and EOS texts as
`bos_token` / `eos_token`, `add_generation_prompt`, and the helpers templates call
(`raise_exception`, `strftime_now`, `tojson` as in transformers).

llama.cpp's built-in `llama_chat_apply_template` recognises a template by its look and
applies a fixed C++ rendering of it instead, which leaves out what the template itself adds
(SmolLM2's default system message, for one); the served prompt is the template's own.

Templates without a system role (Gemma's and older Mistral's raise on a system message,
others leave it out) get it folded into the next user message, as llama-server does
(minja's chat_template: the `supports_system_role` capability and its polyfill): a template
supports the role if a probe system message's text appears in what it renders; if not,
system messages are joined with "\n" and put before the next user message's content
("\n" between), or become a user message of their own before any other message that
comes first (and at the end).
"""

from __future__ import annotations

import functools
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

    @functools.cached_property
    def supports_system_role(self) -> bool:
        """Whether a system message's text appears in what the template renders (minja's
        probe: a system and a user message, no generation prompt; a refusal is a no)."""
        needle = "<System Needle>"
        try:
            return needle in self.render([{"role": "system", "content": needle},
                                          {"role": "user", "content": "<User Needle>"}],
                                         add_generation_prompt=False)
        except ChatTemplateError:
            return False

    def with_system_folded(self, messages: Sequence[Mapping[str, Any]]) -> list[dict]:
        """`messages` as the template can take them: as they are if it supports the system
        role, else with system messages folded into user messages (module docstring)."""
        if self.supports_system_role:
            return [dict(m) for m in messages]
        return fold_system(messages)

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


def fold_system(messages: Sequence[Mapping[str, Any]]) -> list[dict]:
    """System messages folded into user messages (minja's system-role polyfill): their
    contents, joined by "\n", go before the next user message's content ("\n" between,
    nothing if it is empty); before a message of another role, or at the end, they become
    a user message of their own. Messages without content (an assistant's tool calls)
    pass as they are."""
    out: list[dict] = []
    pending = ""

    def flush() -> None:
        nonlocal pending
        if pending:
            out.append({"role": "user", "content": pending})
            pending = ""
    for message in messages:
        message = dict(message)
        content = message.get("content")
        if content is not None:
            if message["role"] == "system":
                pending = f"{pending}\n{content}" if pending else content
                continue
            if message["role"] == "user":
                if pending:
                    message["content"] = pending + (f"\n{content}" if content else "")
                    pending = ""
            else:
                flush()
        out.append(message)
    flush()
    return out
