"""The OpenAI-style API's requests, without any HTTP: a JSON body becomes a checked, frozen
Ask or an ApiError (errors.py) carrying its status and an OpenAI/llama-server error object.

Field types are checked strictly (a boolean is not a number, a number not a string). Fields
that shape the answer are in fields.py: those supported work, the others get a 400 naming
them; fields that do not change the answer (user, metadata, cache_prompt, ...) and unknown
ones are accepted and ignored, as llama-server does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

from ..model.sampling import SamplingParams
from . import fields, tool_calls
from .errors import ERROR_TYPES, ApiError  # noqa: F401 (the API's errors, from here too)
from .fields import Constraint, boolean as _boolean, integer as _integer
from .tool_calls import NATIVE, ToolChoice

MAX_BODY = 1 << 20      # bytes of a request body (413 beyond)
MAX_STOPS = 4           # stop strings per request, as OpenAI allows
ROLES = ("system", "user", "assistant", "tool", "developer")

@dataclass(frozen=True)
class Ask:
    """One checked completion request. `prompts` (completions: each text, or token ids as
    given) or `messages` (dicts for the chat template) is set; `n` choices for each prompt;
    `max_tokens` None means up to the context's end."""
    chat: bool
    prompts: tuple[str | tuple[int, ...], ...]
    messages: tuple[dict, ...] | None
    max_tokens: int | None
    sampling: SamplingParams
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    model: str | None = None
    logprobs: int | None = None    # None: not asked; else top tokens with each one
    ignore_eos: bool = False
    template_kwargs: dict = field(default_factory=dict)   # chat: extra template variables
    n: int = 1
    cache_prompt: bool = True      # reuse a prefix a slot keeps (llama-server's field)
    tools: tuple[dict, ...] = ()   # rendered by the template; its answers' calls parsed
    tool_choice: ToolChoice = ToolChoice()
    tool_format: str = NATIVE      # the model's (prepare.with_tools decides: tool_formats.py)
    constraint: Constraint | None = None   # what the answer keeps to (json / schema / grammar)
    grammar_triggers: tuple[str, ...] = ()   # lazy: the tokens' texts it waits for

    @property
    def n_choices(self) -> int:
        return self.n * max(1, len(self.prompts))


def _is_token(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_body(raw: bytes) -> dict:
    """The JSON object of a request body (ApiError 413 when too large, 400 when not JSON or
    not an object)."""
    if len(raw) > MAX_BODY:
        raise ApiError(413, f"the request body has {len(raw)} bytes, more than the "
                            f"{MAX_BODY} allowed")
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as err:
        raise ApiError(400, f"the request body is not valid JSON: {err}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return body


def parse_completion(body: dict, defaults: SamplingParams, cache_prompt: bool = True) -> Ask:
    """POST /v1/completions: `prompt` is a non-empty string or array of token ids, or a
    list of those (one choice per prompt, `n` each)."""
    prompts = texts_or_tokens(body.get("prompt"), "prompt")
    return _ask(body, defaults, cache_prompt, chat=False,
                prompts=tuple(p if isinstance(p, str) else tuple(p) for p in prompts))


def texts_or_tokens(value, field: str) -> list:
    """A field that is a string, an array of token ids, or a non-empty list of those, as a
    list (400 naming the field, or the item, that is not one)."""
    if isinstance(value, str) or _tokens(value):
        items = [value]
    elif isinstance(value, list) and value:
        items = value
    else:
        raise ApiError(400, f"'{field}' is required: a string, an array of token ids, or a "
                            "list of those", param=field)
    for i, one in enumerate(items):
        if not (isinstance(one, str) or _tokens(one)):
            raise ApiError(400, f"'{field}[{i}]' must be a string or an array of token ids",
                           param=field)
        if not one:
            raise ApiError(400, f"'{field}' is empty" if len(items) == 1 else
                                f"'{field}[{i}]' is empty", param=field)
    return items


def _tokens(value) -> bool:
    """Whether `value` is a non-empty array of token ids."""
    return isinstance(value, list) and bool(value) and all(_is_token(t) for t in value)


def parse_chat(body: dict, defaults: SamplingParams, cache_prompt: bool = True) -> Ask:
    """POST /v1/chat/completions: `messages`, a non-empty list of {role, content}."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise ApiError(400, "'messages' is required and must be a list", param="messages")
    if not messages:
        raise ApiError(400, "'messages' is empty", param="messages")
    pairs = tuple(_message(i, m) for i, m in enumerate(messages))
    tools, tool_choice = tool_calls.parse_tools(body)
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise ApiError(400, "'chat_template_kwargs' must be an object",
                       param="chat_template_kwargs")
    ask = _ask(dict(body, max_tokens=max_tokens), defaults, cache_prompt, chat=True,
               messages=pairs)
    if tools and ask.constraint is not None:
        param = ask.constraint.param
        raise ApiError(400, f"'{param}' and 'tools' together are not supported", param=param)
    return replace(ask, template_kwargs=kwargs or {}, tools=tools, tool_choice=tool_choice)


def _message(i: int, message: Any) -> dict:
    """One message for the template: role and content (text parts joined), and an
    assistant's tool calls or a tool answer's id as given."""
    where = f"messages[{i}]"
    if not isinstance(message, dict):
        raise ApiError(400, f"{where} must be an object with 'role' and 'content'",
                       param="messages")
    role, content = message.get("role"), message.get("content")
    if role not in ROLES:
        raise ApiError(400, f"{where}.role must be one of {', '.join(ROLES)}, not {role!r}",
                       param="messages")
    if isinstance(content, list):  # content parts: text only
        texts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text"
                    and isinstance(part.get("text"), str)):
                raise ApiError(400, f"{where}.content: only text parts "
                                    "({'type': 'text', 'text': ...}) are supported",
                               param="messages")
            texts.append(part["text"])
        content = "".join(texts)
    if message.get("function_call"):
        raise ApiError(400, f"{where}: function_call is not supported (use tool_calls)",
                       param="messages")
    out: dict = {"role": role, "content": content}
    if message.get("tool_calls"):
        out["tool_calls"] = tool_calls.history_calls(where, message["tool_calls"])
    if content is None and role == "assistant":
        out["content"] = "" if "tool_calls" not in out else None
    elif not isinstance(content, str):
        raise ApiError(400, f"{where}.content must be a string", param="messages")
    for key in ("tool_call_id", "name"):
        if isinstance(message.get(key), str):
            out[key] = message[key]
    return out


def _ask(body: dict, defaults: SamplingParams, cache_prompt: bool, chat: bool,
         prompts: tuple = (), messages: tuple | None = None) -> Ask:
    n = _integer(body, "n", 1)
    if n < 1:
        raise ApiError(400, f"'n' must be at least 1, not {n}", param="n")
    fields.refuse_unsupported(body, chat)
    if body.get("max_tokens") is None and body.get("n_predict") is not None:
        body = dict(body, max_tokens=body["n_predict"])   # llama-server's name, -1: no limit
        if body["max_tokens"] == -1:
            body["max_tokens"] = None
    max_tokens = _integer(body, "max_tokens", None)
    if max_tokens is not None and max_tokens <= 0:
        raise ApiError(400, f"'max_tokens' must be at least 1, not {max_tokens}",
                       param="max_tokens")
    stream = _boolean(body, "stream", False)
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise ApiError(400, "'stream_options' must be an object", param="stream_options")
    include_usage = bool(options and options.get("include_usage") is True)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ApiError(400, "'model' must be a string", param="model")
    return Ask(chat, prompts, messages, max_tokens, fields.sampling(body, defaults),
               _stops(body), stream, include_usage, model, fields.logprobs(body, chat),
               _boolean(body, "ignore_eos", False), n=n,
               cache_prompt=_boolean(body, "cache_prompt", cache_prompt),
               constraint=fields.constraint(body))


def _stops(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise ApiError(400, "'stop' must be a string or a list of strings", param="stop")
    if len(stops) > MAX_STOPS:
        raise ApiError(400, f"'stop' has {len(stops)} strings, at most {MAX_STOPS} are allowed",
                       param="stop")
    return tuple(s for s in stops if s)


def check_choices(ask: Ask, slots: int) -> None:
    """400 when the request asks more choices (prompts x n) than requests are generated at
    once (--parallel): they are generated side by side, each in a slot."""
    if ask.n_choices > slots:
        param = "n" if ask.n > slots or len(ask.prompts) <= 1 else "prompt"
        raise ApiError(400, f"{ask.n_choices} choices ({max(1, len(ask.prompts))} prompt(s) x "
                            f"n={ask.n}) are more than the {slots} this server generates at "
                            "once (--parallel)", param=param)


def check_model(asked: str | None, served: str) -> None:
    """404 for a model name other than the one served (none given: the one served)."""
    if asked is not None and asked != served:
        raise ApiError(404, f"the model '{asked}' does not exist: this server serves "
                            f"'{served}'", param="model")


def n_predict(n_prompt: int, max_tokens: int | None, n_ctx: int) -> int:
    """Tokens to generate: `max_tokens`, or up to the context's end when not given; 400
    (llama-server's exceed_context_size_error) when the prompt leaves no room or the prompt
    plus `max_tokens` do not fit in the context."""
    if n_prompt >= n_ctx:
        raise ApiError(400, f"the prompt has {n_prompt} tokens, but the context holds "
                            f"{n_ctx} (prompt and completion together)",
                       "exceed_context_size_error")
    if max_tokens is None:
        return n_ctx - n_prompt
    if n_prompt + max_tokens > n_ctx:
        raise ApiError(400, f"the prompt ({n_prompt} tokens) and max_tokens ({max_tokens}) "
                            f"exceed the context of {n_ctx} tokens",
                       "exceed_context_size_error", param="max_tokens")
    return max_tokens
