"""Scripted stand-ins for the draft model, with the Drafter interface. ScriptedDraft, for the
in-process speculation tests: plans (hypothesis strategies) of what each draft call guesses,
right or wrong at chosen places, with forks; PERFECT and USELESS, the two extremes.
ScriptedDrafter, for drafting under a grammar: the same branches at every call."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from hypothesis import strategies as st


@dataclass(frozen=True)
class BranchPlan:
    length: int               # tokens (clamped to the draft budget)
    wrong_at: int | None      # index of the first wrong token, None: all correct
    offset: int               # how a wrong token differs from the right one


@dataclass(frozen=True)
class ForkPlan:
    parent: int               # branch to fork from (mod existing branches)
    depth: int                # fork depth (mod the parent's length)
    right_first: bool         # the fork's first token is the right one (if still free)
    branch: BranchPlan        # the fork's continuation after its first token


@dataclass(frozen=True)
class DraftPlan:
    give_up: bool             # the draft is "not confident": no tokens
    main: BranchPlan
    forks: tuple[ForkPlan, ...]
    heed_stop: bool = True    # end early when told a result is waiting (as Drafter does)


branch_plans = st.builds(BranchPlan, st.integers(1, 5),
                         st.one_of(st.none(), st.integers(0, 4)), st.integers(0, 10_000))
draft_plans = st.builds(
    DraftPlan, st.sampled_from([False, False, False, True]), branch_plans,
    st.lists(st.builds(ForkPlan, st.integers(0, 2), st.integers(0, 4), st.booleans(),
                       branch_plans), max_size=2).map(tuple),
    st.booleans())


class ScriptedDraft:
    """A draft with the Drafter interface whose guesses follow a script: per call, the right
    continuation (the greedy reference) or tokens going wrong at a chosen index, with forks
    at chosen places. Branches keep the real drafter's shape: branch 0 first, pairwise
    distinct, none a prefix of another."""

    def __init__(self, full_reference: Sequence[int], n_vocab: int, plans: Sequence[DraftPlan]):
        self.ref = list(full_reference)
        self.n_vocab = n_vocab
        self.plans = list(plans)
        self.calls = 0

    def _next(self, seq: Sequence[int]) -> int:
        """The target's greedy token after `seq` (made up, deterministically, once `seq` has
        left the reference)."""
        n = len(seq)
        if n < len(self.ref) and list(seq) == self.ref[:n]:
            return self.ref[n]
        return (sum(seq) * 31 + 7 * n) % self.n_vocab

    def _wrong(self, right: int, offset: int) -> int:
        return (right + 1 + offset % (self.n_vocab - 1)) % self.n_vocab

    def _extend(self, seq: list[int], plan: BranchPlan, count: int) -> list[int]:
        out: list[int] = []
        for i in range(count):
            token = self._next(seq + out)
            if plan.wrong_at == i:
                token = self._wrong(token, plan.offset)
            out.append(token)
        return out

    def prepare(self, context, max_tokens=None) -> None:
        """Nothing to warm up: the script needs no model."""

    def warm_step(self, prompt) -> bool:
        return False

    def draft(self, context, params, cutoff, max_tokens=None, should_stop=None, room=None):
        limit = params.max_tokens if max_tokens is None else max_tokens
        plan = self.plans[self.calls % len(self.plans)]
        self.calls += 1
        if limit <= 0 or plan.give_up:
            return [], []
        context = list(context)
        main = self._extend(context, plan.main, min(limit, plan.main.length))
        # like Drafter: end early with the tokens so far when asked to between draft steps
        # (a result is waiting)
        for i in range(len(main) - 1):
            if plan.heed_stop and should_stop is not None and should_stop():
                return [main[:i + 1]], [1.0] * (i + 1)
        branches = [main]
        for fork in plan.forks[:params.n_parallel - 1]:
            parent = branches[fork.parent % len(branches)]
            depth = fork.depth % len(parent)
            prefix = parent[:depth]
            taken = {b[depth] for b in branches if len(b) > depth and b[:depth] == prefix}
            right = self._next(context + prefix)
            first, k = right, 0
            if not fork.right_first:
                first = self._wrong(right, fork.branch.offset)
            while first in taken:
                k += 1
                first = self._wrong(right, fork.branch.offset + k)
            tokens = prefix + [first]
            more = min(limit, depth + fork.branch.length) - len(tokens)
            branches.append(tokens + self._extend(context + tokens, fork.branch, max(0, more)))
        return branches, [1.0] * len(main)


PERFECT = [DraftPlan(False, BranchPlan(5, None, 0), ())]    # always the right tokens
USELESS = [DraftPlan(False, BranchPlan(5, 0, 3), ())]       # always wrong from the first


class ScriptedDrafter:
    """The draft model's side: returns the branches it was given, and says when it ran."""

    def __init__(self, branches):
        self.branches, self.calls, self.n_held = branches, 0, 7
        self.steps = 0   # tokens of branch 0 the "model" drafted

    def draft(self, context, params, cutoff, max_tokens=None, should_stop=None,
              stop_at=None):
        self.calls += 1
        main = []
        for token in self.branches[0]:   # as Drafter.draft: stop_at after each token
            main.append(token)
            if stop_at is not None and stop_at(main):
                break
        self.steps += len(main)
        branches = [main] + [list(b) for b in self.branches[1:]]
        return branches, [0.9] * len(main)
