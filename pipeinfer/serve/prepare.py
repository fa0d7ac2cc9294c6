"""A checked request (api.Ask) into its tickets for the head: its tool format decided with
the model's template (tool_formats.py), its prompts rendered and tokenized, one ticket per
choice, each with a fresh state of its grammar. Runs in the job's
process (it needs the tokenizer): on the HTTP thread of the job's own server, or on the
thread that takes the front's requests (front_link.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Sequence

from ..model.chat_template import ChatTemplateError
from ..model.grammar import GrammarError
from ..model.llama_lib import LlamaError
from ..api import requests as api, text as text_api
from . import tool_formats
from ..api.requests import ApiError, Ask
from .bridge import Ticket
from ..api.tool_calls import CLOSE, NATIVE, OPEN

Sink = Callable[[int, object], None]   # (choice, event) back to the request's handler


def check(ask: Ask, tokenizer, model_name: str, slots: int) -> None:
    """What the API layer cannot check without the model: its name, the choices against
    --parallel, logit_bias's token ids."""
    api.check_model(ask.model, model_name)
    api.check_choices(ask, slots)
    text_api.check_tokens([t for t, _ in ask.sampling.logit_bias], tokenizer.n_vocab,
                          "logit_bias")


def tickets(ask: Ask, tokenizer, n_ctx: int, sink: Sink,
            resumed: Sequence[Sequence[int]] = ()) -> list[Ticket]:
    """One ticket per choice: each prompt's n choices (choice j's seed: the seed + j, so
    sampled choices differ). `resumed[i]`: the tokens choice i already sent (a request
    resumed after its job ended)."""
    out: list[Ticket] = []
    preserve = _preserved(tokenizer, ask)
    for prompt in ask.prompts or (None,):
        tokens = _prompt_tokens(tokenizer, ask, prompt)
        n_predict = api.n_predict(len(tokens), ask.max_tokens, n_ctx)
        for j in range(ask.n):
            i = len(out)
            sampling = replace(ask.sampling, seed=(ask.sampling.seed + j) % (1 << 64))
            out.append(Ticket(tokens, n_predict, sampling, ask.stop, sink, ask.logprobs,
                              ask.ignore_eos, i, ask.cache_prompt, preserve,
                              _grammar(tokenizer, ask),
                              resumed=tuple(resumed[i]) if i < len(resumed) else ()))
    return out


def with_tools(ask: Ask, tokenizer) -> Ask:
    """The request with its tool format (the model's template decides: tool_formats.py) and
    the grammar its calls keep to, lazy with tool_choice "auto" in the native format (400
    naming `tools` if a tool's parameters cannot be turned into one). A lazy grammar needs
    its triggers to be single tokens of the vocabulary: without them the answer is free."""
    if not (ask.chat and (ask.tools or _has_tool_history(ask.messages))):
        return ask
    fmt = tool_formats.tool_format(_template(tokenizer))
    if not ask.tools:
        return replace(ask, tool_format=fmt)
    triggers = tool_formats.triggers(ask.tool_choice, fmt)
    if any(tokenizer.single_token(text) is None for text in triggers):
        return replace(ask, tool_format=fmt)
    try:
        gbnf = tool_formats.grammar(ask.tools, ask.tool_choice, fmt)
    except GrammarError as err:
        raise ApiError(400, f"'tools': {err}", param="tools") from None
    return replace(ask, tool_format=fmt, grammar=gbnf, grammar_param="tools",
                   grammar_triggers=triggers)


def _has_tool_history(messages) -> bool:
    return any(m.get("tool_calls") or m["role"] == "tool" for m in messages)


def _template(tokenizer):
    try:
        return tokenizer.chat_template()
    except (LlamaError, ChatTemplateError) as err:
        raise ApiError(400, f"cannot render the chat: {err}", param="messages") from None


def _prompt_tokens(tokenizer, ask: Ask, prompt) -> list[int]:
    if isinstance(prompt, tuple):
        text_api.check_tokens(prompt, tokenizer.n_vocab, "prompt")
        return list(prompt)
    if not ask.chat:
        return tokenizer.tokenize(prompt)
    context, messages = dict(ask.template_kwargs), ask.messages
    if ask.tools:
        context["tools"] = [dict(t) for t in ask.tools]
    if ask.tools or _has_tool_history(messages):
        messages = tool_formats.conversation(_template(tokenizer), messages, ask.tools,
                                             ask.tool_format)
    try:
        return tokenizer.chat_tokens(messages, **context)
    except (LlamaError, ChatTemplateError) as err:
        raise ApiError(400, f"cannot render the chat: {err}", param="messages") from None


def _preserved(tokenizer, ask: Ask) -> frozenset[int]:
    """Special tokens whose text the answer keeps (so its tool calls can be parsed)."""
    if not ask.tools or ask.tool_format != NATIVE:
        return frozenset()
    ids = [tokenizer.tokenize(mark, add_special=False) for mark in (OPEN, CLOSE)]
    return frozenset(t[0] for t in ids if len(t) == 1)


def _grammar(tokenizer, ask: Ask):
    """A fresh state of the request's grammar for one choice (400 if it does not parse)."""
    if ask.grammar is None:
        return None
    try:
        return tokenizer.grammar(ask.grammar, ask.grammar_triggers)
    except GrammarError as err:
        raise ApiError(400, f"'{ask.grammar_param}': {err}", param=ask.grammar_param) \
            from None
