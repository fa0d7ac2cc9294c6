"""Drafting under a grammar (engine/drafting/grammar_drafts.py) with SmolLM2's vocabulary: the text a
JSON schema forces is found character by character (whitespace left out), drafted as the
model's tokens without a draft-model step, and the draft model's drafts are cut where the
grammar forbids; the grammar's state follows each job's context, also after a rejection."""

from __future__ import annotations

import pytest

from pipeinfer.engine.drafting.drafter import DraftParams
from pipeinfer.engine.drafting.grammar_drafts import GrammarDrafter, GrammarTrack, Probe
from pipeinfer.engine.drafting.ngram_drafts import NgramDrafts
from pipeinfer.schedule.counters import Counters
from pipeinfer.model.grammar import json_grammar
from pipeinfer.schedule.actions import DraftJob
from support.scripted_draft import ScriptedDrafter

pytestmark = pytest.mark.smollm2

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"]}
PROMPT = (1, 2, 3)


def drafter_for(tokenizer, branches, free=True):
    grammar = tokenizer.grammar(json_grammar(SCHEMA))

    def tokenize(text):
        return tokenizer.tokenize(text, add_special=False, parse_special=False)
    probe = Probe(tokenize, tokenizer.piece, grammar.eos)
    counters = Counters()
    inner = ScriptedDrafter(branches)
    return GrammarDrafter(inner, grammar, len(PROMPT), probe, tokenize, counters, free), \
        inner, counters, tokenize


def text(tokenizer, tokens):
    return b"".join(tokenizer.piece(t) for t in tokens).decode()


def test_forced_text_is_drafted_for_free(tokenizer):
    gd, inner, counters, tokenize = drafter_for(tokenizer, [[5]])
    branches, _ = gd.draft(PROMPT, DraftParams(), 0.0, max_tokens=16)
    assert text(tokenizer, branches[0]) == '{"name":"'
    assert inner.calls == 0 and counters.n_drafted_free == len(branches[0])
    assert gd.n_held == 7                              # (the rest is the draft model's)
    inside = list(PROMPT) + branches[0] + tokenize("Ann")
    branches, _ = gd.draft(inside, DraftParams(), 0.0, max_tokens=2)
    assert inner.calls == 1 and branches == [[5]]   # free text (a string): the model's
    after = inside + tokenize('"')
    branches, _ = gd.draft(after, DraftParams(), 0.0, max_tokens=16)
    assert text(tokenizer, branches[0]) == ',"age":'
    # a rejected draft: the state starts again from the generated tokens the context has
    other = list(PROMPT) + tokenize('{"name":"Bo"')
    branches, _ = gd.draft(other, DraftParams(), 0.0, max_tokens=3)
    assert text(tokenizer, branches[0]).startswith(',"')


def test_drafts_the_grammar_forbids_are_cut(tokenizer):
    good, quote, bad = tokenize_all(tokenizer, 'Ann"', '"', "}")
    gd, inner, counters, tokenize = drafter_for(tokenizer, [good + bad + good, quote + bad],
                                                free=False)
    context = list(PROMPT) + tokenize('{"name":"')
    branches, _ = gd.draft(context, DraftParams(), 0.0, max_tokens=8)
    assert inner.calls == 1   # cut at "}" after the name's string (age is required)
    assert branches == [good, quote]
    assert counters.n_drafts_cut == len(bad) + len(good) + len(bad)
    assert counters.n_drafted_free == 0                 # (free drafts off)


def tokenize_all(tokenizer, *texts):
    return [tokenizer.tokenize(t, add_special=False, parse_special=False) for t in texts]


def test_the_model_stops_where_the_grammar_forces_the_rest(tokenizer):
    """A value the model drafts ends the model's part of the job: the text the grammar forces
    after it follows as free drafts, with no model step for it."""
    tokenize = lambda t: tokenizer.tokenize(t, add_special=False, parse_special=False)  # noqa
    value, forced = tokenize('Ann"'), tokenize(',"age":')
    gd, inner, counters, tokenize = drafter_for(tokenizer, [value + forced + tokenize("4")])
    context = list(PROMPT) + tokenize('{"name":"')
    branches, probs = gd.draft(context, DraftParams(), 0.0, max_tokens=16)
    assert text(tokenizer, branches[0]) == 'Ann",' + '"age":'
    assert inner.steps == len(value)                  # the model stopped after the value
    assert counters.n_drafted_free == len(forced) and len(probs) == len(branches[0])
    gd, inner, counters, _ = drafter_for(tokenizer, [value + forced], free=False)
    branches, _ = gd.draft(context, DraftParams(), 0.0, max_tokens=16)
    assert inner.steps == len(value + forced) and counters.n_drafted_free == 0
    gd, inner, counters, _ = drafter_for(tokenizer, [value + forced])
    branches, _ = gd.draft(context, DraftParams(), 0.0, max_tokens=len(value) + 1)
    assert len(branches[0]) == len(value) + 1         # the job's budget holds



def test_forced_text_fills_the_jobs_room_beyond_its_budget(tokenizer):
    """The draft model's steps are bound by the job's budget (--draft); the text the grammar
    forces costs none, so it goes on up to the job's room (DraftJob.room: the run's limit)."""
    tokenize = lambda t: tokenizer.tokenize(t, add_special=False, parse_special=False)  # noqa
    value, forced = tokenize('Ann"'), tokenize(',"age":')
    gd, inner, counters, tokenize = drafter_for(tokenizer, [value + forced])
    context = list(PROMPT) + tokenize('{"name":"')
    branches, probs = gd.draft(context, DraftParams(), 0.0, max_tokens=len(value),
                               room=len(value + forced))
    assert branches[0] == value + forced and len(probs) == len(branches[0])
    assert inner.steps == len(value) and counters.n_drafted_free == len(forced)
    branches, _ = gd.draft(context, DraftParams(), 0.0, max_tokens=len(value),
                           room=len(value) + 1)
    assert branches[0] == value + forced[:1]          # the room holds
    start, _ = gd.draft(PROMPT, DraftParams(), 0.0, max_tokens=1, room=16)
    assert text(tokenizer, start[0]) == '{"name":"' and len(start[0]) > 1
    drafts, counters, tokenize = lookup_drafts(tokenizer)
    drafts.submit(DraftJob(1, PROMPT, None, 0.3, 1, room=16))
    assert text(tokenizer, drafts.poll().branches[0]) == '{"name":"'


def lookup_drafts(tokenizer, prompt=PROMPT, free=True):
    """NgramDrafts (no draft model) under SCHEMA's grammar for a request of `prompt`."""
    grammar = tokenizer.grammar(json_grammar(SCHEMA))

    def tokenize(text):
        return tokenizer.tokenize(text, add_special=False, parse_special=False)
    counters = Counters()
    track = GrammarTrack(grammar, len(prompt), Probe(tokenize, tokenizer.piece, grammar.eos),
                         tokenize, counters, free)
    return NgramDrafts(1, 4, track=track), counters, tokenize


def answer(drafts, context, budget=8) -> list[int]:
    drafts.submit(DraftJob(1, tuple(context), None, 0.3, budget))
    branches = drafts.poll().branches
    return list(branches[0]) if branches else []


def test_lookups_under_a_grammar_draft_the_forced_text_and_are_cut(tokenizer):
    """With no draft model, the n-gram lookup under a grammar: where the grammar forces
    text, that text's tokens (free, no lookup); a lookup inside free text answers as found;
    one the grammar forbids is cut there; one ending where the grammar forces text goes on
    with that text."""
    drafts, counters, tokenize = lookup_drafts(tokenizer)
    start = answer(drafts, PROMPT, budget=16)
    assert text(tokenizer, start) == '{"name":"' and counters.n_drafted_free == len(start)
    prompt = tuple(tokenize('Ann","age":12} and'))     # the text the lookup finds
    drafts, counters, tokenize = lookup_drafts(tokenizer, prompt)
    inside = list(prompt) + tokenize('{"name":"Ann')
    found = answer(drafts, inside, budget=4)
    assert text(tokenizer, found).startswith('","age')
    assert counters.n_drafted_free == 0 and counters.n_drafts_cut == 0
    track = drafts.track
    bad = tokenize('a"}')                  # "}" ends the object: age is required
    cut = track.shape(inside, bad, 8)
    assert len(cut) < len(bad) and cut == bad[:len(cut)]
    assert counters.n_drafts_cut == len(bad) - len(cut)
    shaped = track.shape(inside, tokenize('a"'), 16)
    assert text(tokenizer, shaped) == 'a","age":' and counters.n_drafted_free > 0
    drafts, counters, tokenize = lookup_drafts(tokenizer, prompt, free=False)
    assert drafts.track.shape(inside, tokenize('a"'), 16) == tokenize('a"')
    assert answer(drafts, list(prompt), budget=8) == [] and counters.n_drafted_free == 0
