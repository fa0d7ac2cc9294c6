"""Drafting under a grammar (structured output): drafts the grammar forbids are cut before
they are sent, and the text it forces is drafted for free, without a draft-model step.

Why: under a grammar the target's token at every verified position comes from the
constrained distribution (model/sampling.py), so a draft the grammar forbids can only be
rejected, and costs its share of a run for nothing. Where the grammar leaves one way to go
(the braces, quotes and keys of a JSON schema) the draft model is not needed to guess it.

What "forced" means here: llama.cpp's JSON-schema grammars allow optional whitespace between
any two JSON tokens, and a BPE vocabulary spells a text in several ways, so the grammar
strictly allows a single token almost never (1 position in 103 of a 5-object list with
Qwen2.5). So the forced text is read character by character: one-character tokens of the
vocabulary are probed against a clone of the grammar at the drafts' tip; while exactly one
character other than whitespace is allowed (and neither the end nor a non-ASCII character,
which would mean free text such as a string's contents), it is taken. The text so found is
tokenized as the model spells text (its tokenizer) and those tokens are the free drafts:
compact JSON, which is what models write. Whatever they are, the answer stays exact: the
target verifies every drafted token, and a wrong guess costs only its cells.

How many: --draft bounds the draft model's steps; the forced text costs none, so it fills a
job up to the run's own limit (DraftJob.room: the exact run size, 7 tokens on the plain
layout, 3 repacked), past --draft: both the free drafts and the longer runs make a
structured answer faster (the documentation's results).
"""

from __future__ import annotations

import os
from typing import Callable, Sequence

import numpy as np

from ...model.grammar import Grammar

# Measurements: "0" turns free drafts off (drafts are still cut to the grammar), to compare.
FREE_DRAFTS_VAR = "PIPEINFER_FREE_DRAFTS"
WHITESPACE = " \t\n\r"
MAX_FORCED_CHARS = 64     # one job's forced text at most (runs take a few tokens anyway)
SENTINELS = "é中"         # non-ASCII characters: allowed, the grammar is in free text


def free_drafts_on() -> bool:
    return os.environ.get(FREE_DRAFTS_VAR, "1") != "0"


class Probe:
    """The one-character tokens of a vocabulary: printable ASCII, the end-of-generation
    token, and a few non-ASCII sentinels."""

    def __init__(self, tokenize: Callable[[str], list[int]], piece: Callable[[int], bytes],
                 eos: int):
        chars, ids = [], []
        for c in [chr(i) for i in range(32, 127)] + list(WHITESPACE[1:]) + list(SENTINELS):
            tokens = tokenize(c)
            if len(tokens) == 1 and piece(tokens[0]) == c.encode("utf-8"):
                chars.append(c)
                ids.append(tokens[0])
        self.chars = chars
        self.ids = np.array(ids + [eos], dtype=np.int32)   # eos last
        self.token = dict(zip(chars, ids))

    def forced_text(self, grammar: Grammar) -> str:
        """The text `grammar` (a clone: it is advanced) forces from here, whitespace left
        out (see the module docstring)."""
        text = ""
        while len(text) < MAX_FORCED_CHARS:
            allowed = grammar.allowed(self.ids)
            if allowed[-1]:
                break                    # the grammar may end here
            chars = [c for c, ok in zip(self.chars, allowed) if ok]
            if any(c in SENTINELS for c in chars):
                break
            chars = [c for c in chars if c not in WHITESPACE]
            if len(chars) != 1:
                break
            grammar.accept(self.token[chars[0]])
            text += chars[0]
        return text


class ForcedWatch:
    """Drafter.draft's `stop_at` under a grammar: follows branch 0 from the drafts' tip and
    says stop where the grammar forces text from there on (the job then ends with that text,
    drafted for free: `forced`), or where it forbids the branch's last token (cut anyway).
    Without it the draft model went on guessing the forced text after each value, a step a
    token (a 5-object JSON list: 127 model-drafted tokens for 124 generated)."""

    def __init__(self, tip: Grammar, probe: Probe):
        self.state, self.probe = tip.clone(), probe
        self.n_seen = 0
        self.forced = ""

    def __call__(self, branch: Sequence[int]) -> bool:
        for token in branch[self.n_seen:]:
            self.n_seen += 1
            if not self.state.allows(token):
                return True
            self.state.accept(token)
        self.forced = self.probe.forced_text(self.state.clone())
        return bool(self.forced)


class GrammarTrack:
    """One generation's grammar followed along each job's context (`n_prompt`: where its
    generated tokens start), and what it makes of a draft there: the forced text's tokens
    (free), a draft cut where the grammar forbids. One per thread that drafts: a grammar
    state is not to be shared."""

    def __init__(self, grammar: Grammar, n_prompt: int, probe: Probe,
                 tokenize: Callable[[str], list[int]], counters, free: bool = True):
        self.n_prompt, self.probe, self.tokenize = n_prompt, probe, tokenize
        self.counters, self.free = counters, free
        self._start = grammar        # a fresh state, kept to start again from
        self._state = grammar.clone()
        self._seen: list[int] = []   # generated tokens _state has accepted

    def tip(self, context: Sequence[int]) -> Grammar | None:
        """The grammar's state after `context`'s generated tokens (None if one of them is
        forbidden: nothing is checked then)."""
        generated = list(context[self.n_prompt:])
        if generated[:len(self._seen)] != self._seen:
            self._state, self._seen = self._start.clone(), []
        for token in generated[len(self._seen):]:
            if not self._state.allows(token):
                return None
            self._state.accept(token)
            self._seen.append(token)
        return self._state

    def forced(self, state: Grammar, limit: int) -> list[int]:
        """The tokens of the text the grammar forces at `state` (a clone is advanced), at
        most `limit`, counted as free drafts; none with free drafts off."""
        if not self.free or limit <= 0:
            return []
        return self.free_tokens(self.probe.forced_text(state.clone()), limit)

    def free_tokens(self, text: str, limit: int) -> list[int]:
        """`text` (forced by the grammar) as the model spells it, at most `limit` tokens,
        counted as free drafts."""
        tokens = self.tokenize(text)[:max(0, limit)]
        self.counters.n_drafted_free += len(tokens)
        return tokens

    def cut(self, tip: Grammar, branch: Sequence[int]) -> list[int]:
        """`branch` up to the first token the grammar forbids (counted as cut)."""
        return self._cut(tip, branch)[0]

    def _cut(self, tip: Grammar, branch: Sequence[int]) -> tuple[list[int], Grammar]:
        """cut's tokens, and the grammar's state after them (a clone of `tip`)."""
        state, kept = tip.clone(), []
        for token in branch:
            if not state.allows(token):
                break
            state.accept(token)
            kept.append(token)
        self.counters.n_drafts_cut += len(branch) - len(kept)
        return kept, state

    def shape(self, context: Sequence[int], found: Sequence[int], limit: int) -> list[int]:
        """A lookup's draft `found` (n-gram drafts, ngram_drafts.py) under the grammar:
        the forced text where the grammar forces one, else `found` cut where the grammar
        forbids, followed by the text the grammar forces after it (all within `limit`: the
        job's room)."""
        tip = self.tip(context)
        if tip is None:
            return list(found[:limit])
        forced = self.forced(tip, limit)
        if forced:
            return forced
        kept, after = self._cut(tip, found[:limit])
        if not kept:
            return kept
        return kept + self.forced(after, limit - len(kept))


class GrammarDrafter:
    """A Drafter (engine/drafting/drafter.py) whose drafts keep to one generation's grammar. Runs
    where the draft jobs run (the draft thread), with a GrammarTrack of its own."""

    def __init__(self, drafter, grammar: Grammar, n_prompt: int, probe: Probe,
                 tokenize: Callable[[str], list[int]], counters, free: bool = True):
        self.drafter = drafter
        self.track = GrammarTrack(grammar, n_prompt, probe, tokenize, counters, free)

    def __getattr__(self, name):
        return getattr(self.drafter, name)   # prepare, sync, n_held, reset, ...

    def draft(self, context: Sequence[int], params, cutoff: float,
              max_tokens: int | None = None, should_stop=None, room: int | None = None):
        """Drafter.draft under the grammar: the forced text's tokens if there are any (no
        draft-model step), else the draft model's branches cut where the grammar forbids,
        branch 0 followed by the text forced after it. The model drafts at most `max_tokens`
        (steps cost); the forced text fills a branch up to `room` (DraftJob.room: free
        tokens are bound by the run's limits, not by --draft)."""
        limit = params.max_tokens if max_tokens is None else max_tokens
        room = limit if room is None else max(limit, room)
        track = self.track
        tip = track.tip(context)
        if tip is None or limit <= 0:
            return self.drafter.draft(context, params, cutoff, max_tokens, should_stop)
        forced = track.forced(tip, room)
        if forced:
            return [forced], [1.0] * len(forced)
        watch = ForcedWatch(tip, track.probe) if track.free else None
        branches, probs = self.drafter.draft(context, params, cutoff, max_tokens,
                                             should_stop, stop_at=watch)
        kept = [track.cut(tip, branch) for branch in branches]
        probs = probs[:len(kept[0])] if kept else []
        if watch is not None and watch.forced and kept and kept[0] == branches[0]:
            forced = track.free_tokens(watch.forced, room - len(kept[0]))
            kept[0], probs = kept[0] + forced, list(probs) + [1.0] * len(forced)
        cut = [b for b in kept if b]
        return cut, probs
