"""A checked request (api.Ask) into its tickets for the head: its prompts rendered and
tokenized, one ticket per choice, each with a fresh state of its grammar. Runs in the job's
process (it needs the tokenizer): on the HTTP thread of the job's own server, or on the
thread that takes the front's requests (front_link.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Sequence

from ..model.chat_template import ChatTemplateError
from ..model.grammar import GrammarError
from ..model.llama_lib import LlamaError
from . import api, text_api
from .api import ApiError, Ask
from .bridge import Ticket
from .tool_calls import CLOSE, OPEN

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


def _prompt_tokens(tokenizer, ask: Ask, prompt) -> list[int]:
    if isinstance(prompt, tuple):
        text_api.check_tokens(prompt, tokenizer.n_vocab, "prompt")
        return list(prompt)
    if not ask.chat:
        return tokenizer.tokenize(prompt)
    context = dict(ask.template_kwargs)
    try:
        if ask.tools:
            _check_tool_template(tokenizer)
            context["tools"] = [dict(t) for t in ask.tools]
        return tokenizer.chat_tokens(ask.messages, **context)
    except (LlamaError, ChatTemplateError) as err:
        raise ApiError(400, f"cannot render the chat: {err}", param="messages") from None


def _check_tool_template(tokenizer) -> None:
    if "tools" not in tokenizer.chat_template().source:
        raise ApiError(400, "'tools': this model's chat template has no tool support (the "
                            "generic tool format needs constrained decoding, which this "
                            "server does not do yet)", param="tools")


def _preserved(tokenizer, ask: Ask) -> frozenset[int]:
    """Special tokens whose text the answer keeps (so its tool calls can be parsed)."""
    if not ask.tools:
        return frozenset()
    ids = [tokenizer.tokenize(mark, add_special=False) for mark in (OPEN, CLOSE)]
    return frozenset(t[0] for t in ids if len(t) == 1)


def _grammar(tokenizer, ask: Ask):
    """A fresh state of the request's grammar for one choice (400 if it does not parse)."""
    if ask.grammar is None:
        return None
    try:
        return tokenizer.grammar(ask.grammar)
    except GrammarError as err:
        raise ApiError(400, f"'{ask.grammar_param}': {err}", param=ask.grammar_param) \
            from None
