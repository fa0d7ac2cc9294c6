"""How soon the draft model tries again after attempts that drafted nothing
(schedule/retry.py): the policy on its own, then inside the pipeinfer schedule with real tiny
stages and a scripted draft that is never confident (no MPI)."""

from __future__ import annotations

import pytest

from pipeinfer.schedule import pipeinfer as pipeinfer_schedule
from pipeinfer.schedule.options import SpecOptions
from pipeinfer.schedule.retry import MAX_WAIT, Retry
from support.rig import check_consistent, run_inprocess
from support.scripted_draft import PERFECT, BranchPlan, DraftPlan, ScriptedDraft
from support.stepped_transport import SteppedTransport

NEVER = [DraftPlan(True, BranchPlan(1, None, 0), ())]   # never confident: drafts nothing
N = 64


def test_failures_at_the_floor_space_out_attempts_up_to_a_bound():
    retry = Retry()
    waits = []
    n = 10
    for _ in range(6):
        retry.failed(n, at_floor=True)
        waits.append(retry.wait)
        assert not retry.ready(n) and not retry.ready(n + retry.wait - 1)
        n += retry.wait
        assert retry.ready(n)
    assert waits == [1, 2, 4, 8, 8, 8] and MAX_WAIT == 8


def test_a_cutoff_that_can_still_decay_or_a_draft_ends_the_wait():
    retry = Retry()
    for n in (10, 11, 13):
        retry.failed(n, at_floor=True)
    retry.failed(17, at_floor=False)     # the cutoff went lower: try again at once
    assert retry.ready(17)
    retry.failed(17, at_floor=True)
    retry.failed(18, at_floor=True)
    retry.drafted()
    assert retry.ready(18) and retry.wait == 0


def go(tiny, plans, max_wait: int | None = None, monkeypatch=None, source: str = "model"):
    if max_wait is not None:
        monkeypatch.setattr(pipeinfer_schedule, "Retry", lambda: Retry(max_wait))
    draft = ScriptedDraft(tiny.full, tiny.n_vocab, plans)
    spec = SpecOptions(draft_thread=False, p_decay=0.0, guard=False, draft_source=source)
    out = run_inprocess(tiny, "pipeinfer", draft, spec=spec, n_predict=N,
                        transport=lambda stages: SteppedTransport(stages, lag=1))
    check_consistent(out, tiny.reference, N)   # exact either way
    return draft.calls, out.counters


@pytest.mark.parametrize("source", ["model", "both"])   # (both: n-gram lookups go on)
def test_a_draft_never_confident_is_asked_a_fraction_as_often(tiny, monkeypatch, source):
    spaced, _ = go(tiny, NEVER, source=source)
    every_token, _ = go(tiny, NEVER, max_wait=1, monkeypatch=monkeypatch, source=source)
    assert every_token >= N // 2, every_token     # (the plain rule: once per new token)
    assert spaced * 3 <= every_token, (spaced, every_token)


def test_a_draft_that_becomes_confident_is_back_within_the_wait(tiny):
    calls, counters = go(tiny, NEVER * 6 + PERFECT * 500)
    assert counters.n_accepted >= N // 2, counters
