"""The never-slower guard (schedule/guard.py) on scripted run outcomes: acceptance drops ->
speculation pauses; the pause ends with a probe; a failed probe doubles the pause, a probe that
pays resets it; a threshold of 0 never pauses."""

from __future__ import annotations

from pipeinfer.schedule.guard import Guard


def feed(guard: Guard, outcomes, n_generated: int = 0) -> list[str]:
    reasons = []
    for guessed, accepted in outcomes:
        why = guard.observe(guessed, accepted, n_generated)
        if why:
            reasons.append(why)
    return reasons


def test_good_acceptance_never_pauses():
    guard = Guard(threshold=0.2, window=16)
    assert feed(guard, [(4, 3)] * 50) == []
    assert guard.allows(100) == (True, None)


def test_poor_acceptance_pauses_then_probes():
    guard = Guard(threshold=0.2, window=16, first_pause=8)
    assert feed(guard, [(4, 0)] * 3, n_generated=10) == []        # 12 < window: no decision
    [why] = feed(guard, [(4, 0)], n_generated=10)
    assert "pause for 8" in why
    assert guard.allows(17) == (False, None)
    # runs still in flight when it paused do not count during the pause
    assert feed(guard, [(4, 0)] * 10, n_generated=12) == []
    ok, why = guard.allows(18)
    assert ok and "probing" in why
    assert guard.allows(19) == (True, None)


def test_failed_probe_doubles_pause_and_paying_probe_resets_it():
    guard = Guard(threshold=0.25, window=8, first_pause=4, max_pause=16)
    feed(guard, [(4, 0), (4, 0)], n_generated=0)                  # pause 4
    assert guard.allows(4)[0]
    [why] = feed(guard, [(4, 1), (4, 0)], n_generated=4)          # 1/8 < 0.25 in the probe
    assert "pause for 8" in why and not guard.allows(11)[0]
    assert guard.allows(12)[0]
    [why] = feed(guard, [(8, 0)], n_generated=12)
    assert "pause for 16" in why and guard.allows(28)[0]
    [why] = feed(guard, [(8, 0)], n_generated=28)
    assert "pause for 16" in why                                  # capped at max_pause
    assert guard.allows(44)[0]
    assert feed(guard, [(4, 4), (4, 4)], n_generated=44) == []    # the probe pays
    assert guard.pause == 4


def test_window_slides_over_recent_runs():
    guard = Guard(threshold=0.5, window=8)
    assert feed(guard, [(4, 0)] + [(4, 4)] * 2) == []   # the bad run slid out of the window
    assert guard.allows(0) == (True, None)


def test_threshold_zero_is_off():
    guard = Guard(threshold=0.0)
    assert feed(guard, [(8, 0)] * 20) == []
    assert guard.allows(1000) == (True, None)


# --- the guard inside the schedule: real tiny stages, scripted drafts (no MPI) -------------------

import pytest  # noqa: E402

from pipeinfer.schedule.options import SpecOptions  # noqa: E402
from support.rig import check_consistent, run_inprocess  # noqa: E402
from support.scripted_draft import PERFECT, ScriptedDraft, USELESS  # noqa: E402
from support.stepped_transport import SteppedTransport  # noqa: E402

N = 40


def go(tiny, strategy, plans, guard_accept):
    spec = SpecOptions(draft_thread=False, p_accept=0.0, p_recovery=0.0, p_decay=0.0, guard_accept=guard_accept)
    out = run_inprocess(tiny, strategy, ScriptedDraft(tiny.full, tiny.n_vocab, plans),
                        spec=spec, n_predict=N,
                        transport=lambda stages: SteppedTransport(stages, lag=1))
    check_consistent(out, tiny.reference, N)   # exact either way
    return out.counters


@pytest.mark.parametrize("strategy", ["speculative", "pipeinfer"])
def test_useless_drafts_pause_speculation(tiny, strategy):
    """Drafts that are always wrong: with the guard, speculation recedes to its probes."""
    off = go(tiny, strategy, USELESS, 0.0)
    on = go(tiny, strategy, USELESS, 0.2)
    assert on.n_accepted == off.n_accepted == 0
    assert on.runs_speculative * 3 <= off.runs_speculative, (on, off)
    assert on.runs_speculative > 0        # it probed again after the first pause


@pytest.mark.parametrize("strategy", ["speculative", "pipeinfer"])
def test_good_drafts_keep_speculating(tiny, strategy):
    """Drafts that are always right: the guard changes nothing."""
    assert go(tiny, strategy, PERFECT, 0.2) == go(tiny, strategy, PERFECT, 0.0)


@pytest.mark.parametrize("strategy", ["speculative", "pipeinfer"])
def test_speculation_returns_when_drafts_recover(tiny, strategy):
    """Useless drafts first, then good ones: the guard pauses, probes, and speculation comes
    back (most tokens are then accepted drafts), not later than a few pauses."""
    plans = USELESS * 6 + PERFECT * 200
    on = go(tiny, strategy, plans, 0.2)
    assert on.n_accepted >= N // 2, on


# --- the guard under n-gram chains: one mismatch is one mistake -----------------------------------

from pipeinfer.engine.drafting.ngram_drafts import NgramDrafts  # noqa: E402
from pipeinfer.schedule.actions import PolicyChanged  # noqa: E402
from pipeinfer.schedule.pipeinfer import PipeInfer  # noqa: E402
from support.ngram_script import EDITED, PROMPT, drive, make  # noqa: E402


def guard_pauses(log) -> list[PolicyChanged]:
    return [a for a in log if isinstance(a, PolicyChanged) and a.name == "guard"]


def test_runs_cancelled_behind_a_mismatch_do_not_pause_speculation():
    """A chain of n-gram runs, six deep: a mismatch cancels the runs continuing the rejected
    guess. Their guesses were never judged, so the guard does not count them as rejected:
    the draft's one mistake in 19 tokens never pauses speculation."""
    sched = make(PipeInfer, n_predict=120, draft=3)
    log = drive(sched, NgramDrafts(2, 4), depth=6, target=EDITED)
    c = sched.gen.counters
    assert sched.gen.tokens == EDITED[len(PROMPT):len(PROMPT) + 120]
    assert c.runs_cancelled_invalidated >= 10 and c.n_unverified > c.n_accepted / 3  # chains
    assert guard_pauses(log) == []
    assert c.n_accepted > 80
