"""A lazy grammar (model/grammar.py), as tool_choice "auto" uses it with Qwen2.5's vocabulary
(`<tool_call>` is one added token): every token is allowed until the trigger token, from
which the tool-call grammar applies; clones and fresh states keep that; drafting under it
(engine/drafting/grammar_drafts.py) invents no forced text while it waits, drafts the forced text
once triggered, and cuts nothing a free answer may write."""

from __future__ import annotations

import numpy as np
import pytest

from pipeinfer.engine.drafting.drafter import DraftParams
from pipeinfer.engine.drafting.grammar_drafts import GrammarDrafter, Probe
from pipeinfer.schedule.counters import Counters
from pipeinfer.model.grammar import GrammarError
from pipeinfer.model.tokenizer import Tokenizer
from pipeinfer.serve import tool_formats
from pipeinfer.api.tool_calls import NATIVE, OPEN, ToolChoice
from support.cached_models import cached_models
from support.scripted_draft import ScriptedDrafter

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
AUTO = ToolChoice()
PROMPT = (1, 2, 3)


@pytest.fixture(scope="module")
def qwen():
    tok = Tokenizer(cached_models("qwen-coder-0.5b")[0])
    yield tok
    tok.close()


def lazy(tokenizer):
    return tokenizer.grammar(tool_formats.grammar([WEATHER], AUTO, NATIVE),
                             tool_formats.triggers(AUTO, NATIVE))


def words(tokenizer, text: str) -> list[int]:
    return tokenizer.tokenize(text, add_special=False, parse_special=False)


def test_auto_waits_for_the_tool_call_token(qwen):
    assert tool_formats.triggers(AUTO, NATIVE) == (OPEN,)
    assert tool_formats.triggers(ToolChoice(required=True), NATIVE) == ()
    grammar = lazy(qwen)
    assert grammar.triggers == (qwen.single_token(OPEN),) == (151657,)
    logits = np.random.default_rng(0).standard_normal(qwen.n_vocab).astype(np.float32)
    for token in words(qwen, "Let me check the weather. "):
        assert np.array_equal(grammar.mask(logits), logits)   # waiting: nothing masked
        assert grammar.allows(grammar.eos)                     # (ending too)
        grammar.accept(token)
    waiting = grammar.clone()
    grammar.accept(qwen.single_token(OPEN))
    masked = grammar.mask(logits)
    allowed = np.flatnonzero(np.isfinite(masked))
    assert len(allowed) and all(qwen.piece(int(t)).startswith(b"\n") for t in allowed)
    assert not grammar.allows(grammar.eos) and not grammar.allows(words(qwen, "Hi")[0])
    # the clone taken before the trigger still waits, and so does a fresh state
    assert waiting.allows(words(qwen, "Hi")[0]) and grammar.fresh().allows(grammar.eos)
    for token in words(qwen, '\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'):
        assert grammar.allows(token)
        grammar.accept(token)
    grammar.accept(qwen.single_token("</tool_call>"))
    assert grammar.allows(grammar.eos) and not grammar.allows(words(qwen, "Hi")[0])


def test_a_trigger_must_be_one_token(qwen):
    with pytest.raises(GrammarError):
        qwen.grammar('root ::= "<tool" "x"', ("<toolx",))


def test_drafts_invent_nothing_before_the_trigger(qwen):
    grammar = lazy(qwen)

    def tokenize(text):
        return words(qwen, text)
    probe = Probe(tokenize, qwen.piece, grammar.eos)
    assert probe.forced_text(grammar.clone()) == ""
    free_text = words(qwen, "Sure! Paris is lovely.")
    inner = ScriptedDrafter([free_text])
    counters = Counters()
    drafter = GrammarDrafter(inner, grammar, len(PROMPT), probe, tokenize, counters)
    branches, _ = drafter.draft(PROMPT, DraftParams(), 0.0, max_tokens=16)
    assert branches == [free_text] and inner.calls == 1        # the model's, uncut
    assert counters.n_drafted_free == 0 and counters.n_drafts_cut == 0
    context = list(PROMPT) + words(qwen, "Let me see. ") + [qwen.single_token(OPEN)] + \
        words(qwen, "\n")
    branches, _ = drafter.draft(context, DraftParams(), 0.0, max_tokens=32)
    assert inner.calls == 1     # triggered: the call's forced text, drafted for free
    assert qwen.detokenize(branches[0]) == '{"name":"get_weather","arguments":{"city":"'
    inner.branches = [words(qwen, 'Paris"}}') + words(qwen, " and more")]
    branches, _ = drafter.draft(context + branches[0], DraftParams(), 0.0, max_tokens=16)
    assert qwen.detokenize(branches[0]) == 'Paris"}}'   # cut where the call must end
