"""A checked request (api.Ask) into its tickets for the head: its tool format decided with
the model's template (tool_formats.py), its prompts rendered and tokenized, one ticket per
choice, each with a fresh state of its grammar; an embedding request into its one ticket.
Runs in the job's process (it needs the tokenizer), on the thread that takes the front's
messages (intake.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Sequence

from ..model.chat_template import ChatTemplateError
from ..model.grammar import GrammarError, json_grammar
from ..model.llama_lib import LlamaError
from ..api import requests as api, text as text_api
from ..api.embeddings import EmbedAsk
from ..api.fields import Constraint
from ..api.requests import ApiError, Ask
from ..api.tool_calls import CLOSE, NATIVE, OPEN
from ..config.serving import OFF
from ..engine.head.embedding_job import pooling_of
from . import tool_formats
from .bridge import Ticket

Sink = Callable[[int, object], None]   # (choice, event) back to the request's handler


def check(ask: Ask, tokenizer, model_name: str, slots: int) -> None:
    """What the API layer cannot check without the model: its name, the choices against
    --parallel, logit_bias's token ids."""
    api.check_model(ask.model, model_name)
    api.check_choices(ask, slots)
    text_api.check_tokens([t for t, _ in ask.sampling.logit_bias], tokenizer.n_vocab,
                          "logit_bias")


def tickets(ask: Ask, tokenizer, n_ctx: int, sink: Sink,
            resumed: Sequence[Sequence[int]] = (), cache: str = OFF) -> list[Ticket]:
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
                              ask.ignore_eos, i, cache if ask.cache_prompt else OFF, preserve,
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
    return replace(ask, tool_format=fmt, constraint=Constraint("tools", gbnf=gbnf),
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
    constraint = ask.constraint
    if constraint is None:
        return None
    try:
        gbnf = constraint.gbnf if constraint.gbnf is not None else json_grammar(
            constraint.schema)
        return tokenizer.grammar(gbnf, ask.grammar_triggers)
    except GrammarError as err:
        raise ApiError(400, f"'{constraint.param}': {err}", param=constraint.param) from None


def model_pooling(tokenizer) -> str:
    """The pooling of the served model (its GGUF's `{arch}.pooling_type`, else mean)."""
    arch = tokenizer.metadata("general.architecture")
    return pooling_of(tokenizer.metadata(f"{arch}.pooling_type") if arch else None)


def embedding_ticket(ask: EmbedAsk, tokenizer, n_ctx: int, sink) -> Ticket:
    """The request's one ticket for the head: each input tokenized as llama-server does
    (special tokens added and parsed), none longer than the context."""
    inputs = []
    for one in ask.inputs:
        if isinstance(one, tuple):
            text_api.check_tokens(one, tokenizer.n_vocab, "input")
            tokens = list(one)
        else:
            tokens = tokenizer.tokenize(one)
        if len(tokens) > n_ctx:
            raise ApiError(400, f"an input has {len(tokens)} tokens, more than the context's "
                                f"{n_ctx}", "exceed_context_size_error", param="input")
        inputs.append(tuple(tokens))
    return Ticket(list(inputs[0]), 0, None, (), sink, inputs=tuple(inputs),
                  pooling=model_pooling(tokenizer))
