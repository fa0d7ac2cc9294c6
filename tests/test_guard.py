"""The never-slower guard (schedule/guard.py) on scripted times: speculation that makes tokens
slower than plain decoding pauses; the pause ends with a probe; a failed probe doubles the
pause, a probe that pays resets it; the pauses' own tokens update the plain figure; a guard
turned off never pauses. Then inside the schedule, on real tiny stages whose time is counted
per evaluated and per drafted token (useless drafts pause, perfect ones never do, recovered
ones come back)."""

from __future__ import annotations

import pytest

from pipeinfer.schedule.guard import MARGIN, Guard


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def guard_with_plain(plain_s: float = 1.0, **kw) -> tuple[Guard, Clock]:
    """A guard that measured plain decoding at `plain_s` a token: a window speculating at
    that speed, the measuring pause it asks for, three clean runs of `plain_s` in it. Its
    tokens count up to 0, so that a test's own start at 0."""
    clock = Clock()
    guard = Guard(clock=clock, **kw)
    assert guard.allows(0) == (True, None)
    [why] = tokens(guard, clock, -(guard.window + 4), guard.window + 1, plain_s)
    assert "measuring one" in why
    clean_runs(guard, clock, -3, 3, plain_s)
    ok, why = guard.allows(0)
    assert ok and why.startswith("measured plain decoding")
    return guard, clock


def clean_runs(guard: Guard, clock: Clock, start: int, count: int, seconds: float) -> None:
    """`count` one-token runs after `start`, each sent alone with no draft job out and back
    `seconds` later with its token."""
    for n in range(start + 1, start + count + 1):
        guard.sent_alone(1000 + n)
        clock.now += seconds
        guard.returned(1000 + n)
        guard.generated(n)


def tokens(guard: Guard, clock: Clock, start: int, count: int, seconds: float,
           per_arrival: int = 1, guesses: int = 2) -> list[str]:
    """`count` tokens after `start`, `per_arrival` at a time, `seconds` apart per token, each
    arrival after a speculative run of `guesses` guessed tokens left; the reasons the guard
    gave (pauses)."""
    reasons = []
    for n in range(start + per_arrival, start + count + 1, per_arrival):
        clock.now += seconds * per_arrival
        guard.drafted(guesses)
        why = guard.generated(n)
        if why:
            reasons.append(why)
    return reasons


def test_faster_speculation_never_pauses():
    guard, clock = guard_with_plain(1.0)
    assert tokens(guard, clock, 0, 200, 0.6, per_arrival=4) == []
    assert guard.allows(200) == (True, None)
    assert guard.spec_s == pytest.approx(0.6)


def test_slower_speculation_pauses_after_a_window_then_probes():
    guard, clock = guard_with_plain(1.0, window=8, first_pause=16)
    assert tokens(guard, clock, 0, 8, 1.2) == []       # 7 intervals measured: no decision
    [why] = tokens(guard, clock, 8, 1, 1.2)
    assert "1200 ms a token speculating > 1000 ms plain: pause for 16" in why
    assert guard.allows(24) == (False, None)
    tokens(guard, clock, 9, 16, 1.0)                   # plain decoding meanwhile
    ok, why = guard.allows(25)
    assert ok and "probing after a pause of 16" in why
    assert guard.allows(26) == (True, None)


def bursts(guard: Guard, clock: Clock, start: int, pairs: int, late: float = 4.0) -> list[str]:
    """Arrivals as speculation brings them: one token 0.2 s after the last, then three
    together `late` s later (4.0: 1.05 s a token on average, in bursts); the guard's
    reasons."""
    reasons, n = [], start
    for _ in range(pairs):
        for seconds, count in ((0.2, 1), (late, 3)):
            clock.now += seconds
            n += count
            guard.drafted(2)
            if why := guard.generated(n):
                reasons.append(why)
    return reasons


def test_a_slower_figure_over_a_few_bursts_is_not_enough_to_pause():
    """1.05 s a token against plain decoding's 1.0 pauses speculation when its tokens came
    steadily, but not over a few bursts whose figure could as well be under 1.0 (the
    standard error of the ratio): the guard judges again at the next token."""
    steady, clock = guard_with_plain(1.0, window=8)
    assert tokens(steady, clock, 0, 8, 1.05) == []
    assert len(tokens(steady, clock, 8, 1, 1.05)) == 1
    bursty, clock = guard_with_plain(1.0, window=8)
    assert bursts(bursty, clock, 0, 3) == []
    assert bursty.spec_s > 1.0 * (1 + MARGIN)     # (over the margin: the figure alone paused)


def test_bursts_that_cost_time_pause_once_the_figure_is_sure():
    """Speculation at 1.2 s a token in the same bursts: not at the first window, but the more
    tokens its figure spans, the surer it gets, and it pauses."""
    guard, clock = guard_with_plain(1.0, window=8)
    assert bursts(guard, clock, 0, 2, late=4.6) == []
    assert bursts(guard, clock, 8, 14, late=4.6) != []


def test_failed_probe_doubles_pause_and_paying_probe_resets_it():
    guard, clock = guard_with_plain(1.0, window=4, first_pause=4, max_pause=16)
    [why] = tokens(guard, clock, 0, 5, 2.0)
    assert "pause for 4" in why
    n, waited = 5, 4
    for pause in (8, 16, 16):                         # doubled, then capped at max_pause
        tokens(guard, clock, n, waited, 1.0)
        n += waited
        assert guard.allows(n)[0]
        [why] = tokens(guard, clock, n, 5, 2.0)       # the probe is slower: it failed
        n += 5
        assert f"pause for {pause} tokens" in why and not guard.allows(n)[0]
        waited = pause
    tokens(guard, clock, n, 16, 1.0)
    n += 16
    assert guard.allows(n)[0]
    assert tokens(guard, clock, n, 20, 0.5) == []      # the probe pays
    assert guard.pause == 4


def test_a_probe_within_the_margin_doubles_the_next_pause():
    """A probe no faster than plain decoding, but within the margin, goes on speculating; it
    did not pay, so when speculation is paused later the pause is twice as long. Only
    speculation faster than plain decoding makes pauses short again."""
    guard, clock = guard_with_plain(1.0, window=4, first_pause=4, max_pause=64)
    [why] = tokens(guard, clock, 0, 5, 2.0)
    assert "pause for 4" in why
    tokens(guard, clock, 5, 4, 1.0)
    assert guard.allows(9)[0]                          # the probe
    assert tokens(guard, clock, 9, 8, 1.02) == []      # within the margin: left alone
    [why] = tokens(guard, clock, 17, 4, 2.0)
    assert "pause for 8 tokens" in why
    end = guard.resume_at                              # 8 tokens after it paused
    tokens(guard, clock, 21, end - 21, 1.0)
    assert guard.allows(end - 1) == (False, None) and guard.allows(end)[0]
    assert tokens(guard, clock, end, 12, 0.9) == []    # faster than plain: pays
    assert guard.pause == 4


def test_guesses_none_accepted_pause_at_once():
    """A window of verified guesses with not one accepted pauses speculation without timing
    it (before any plain figure, or however fast its tokens came); a probe that ends so
    doubles the pause. One accepted guess leaves the decision to the clock."""
    clock = Clock()
    guard = Guard(clock=clock, window=4, first_pause=8)
    guard.allows(0)
    guard.drafted(3, accepted=0)
    assert guard.generated(1) is None
    guard.drafted(2, accepted=0)
    assert guard.generated(2) == "5 guesses, none accepted: pause for 8 tokens"
    clean_runs(guard, clock, 2, 8, 1.0)
    ok, why = guard.allows(10)
    assert ok and why == "probing after a pause of 8 (1000 ms a token plain)"
    guard.drafted(4, accepted=0)
    assert guard.generated(11) == "4 guesses, none accepted: pause for 16 tokens"
    clean_runs(guard, clock, 11, 16, 1.0)
    assert guard.allows(27)[0]
    guard.drafted(3, accepted=1)
    guard.drafted(3, accepted=0)
    guard.drafted(3)                                   # never verified: not judged
    assert tokens(guard, clock, 27, 3, 0.5, guesses=0) == []


def test_pauses_measure_plain_decoding():
    """A pause without clean runs (generations sharing the pipeline keep it busy) measures its
    tokens from its second arrival on (the first may come from a speculative run); the figure
    moves halfway to what they took."""
    guard, clock = guard_with_plain(1.0, window=4, first_pause=8)
    tokens(guard, clock, 0, 5, 1.5)
    clock.now += 5.0                                   # a late speculative run's token
    guard.generated(6)
    tokens(guard, clock, 6, 8, 2.0)
    assert guard.allows(14)[0]
    assert guard.plain_s == pytest.approx(1.5)
    assert tokens(guard, clock, 14, 8, 1.4) == []      # now faster than plain: no pause


def test_a_pause_takes_the_median_of_its_clean_runs():
    guard, clock = guard_with_plain(1.0, window=4, first_pause=8)
    tokens(guard, clock, 0, 5, 1.5)                    # pauses
    clock.now += 5.0
    guard.generated(6)
    for n, seconds in zip(range(7, 15), (3.0, 3.0, 3.0, 3.0, 3.0, 9.0, 9.0, 3.0)):
        clean_runs(guard, clock, n - 1, 1, seconds)
    assert guard.allows(14)[0]
    assert guard.plain_s == pytest.approx((3.0 + 1.0) / 2)


def test_without_a_plain_figure_the_first_pause_measures_one():
    """Plain decoding is measured on clean runs of a pause: three of them end it (here the
    third token of the pause), and speculation that was faster goes on, unpaused."""
    clock = Clock()
    guard = Guard(clock=clock, window=4, first_pause=8)
    guard.allows(0)
    [why] = tokens(guard, clock, 0, 5, 0.5)
    assert "no plain-decoding figure yet: measuring one: pause for 12 tokens" in why
    clean_runs(guard, clock, 5, 2, 1.0)
    assert guard.allows(7) == (False, None)
    clean_runs(guard, clock, 7, 1, 1.0)
    ok, why = guard.allows(8)
    assert ok and why == "measured plain decoding (1000 ms a token plain)"
    assert guard.plain_s == 1.0
    assert tokens(guard, clock, 8, 20, 0.5) == []
    assert guard.pause == 8                            # a measurement is not a failed probe


def test_runs_in_flight_do_not_end_the_measurement():
    """The speculative runs still in flight deliver the measuring pause's first tokens at
    speculation's pace: they neither end it nor enter its figure."""
    clock = Clock()
    guard = Guard(clock=clock, window=4, first_pause=8)
    guard.allows(0)
    tokens(guard, clock, 0, 5, 0.5)
    for n in range(6, 26):
        clock.now += 0.1
        guard.generated(n, speculative=True)
    assert guard.allows(25) == (False, None)
    clean_runs(guard, clock, 25, 3, 1.0)
    assert guard.allows(28) == (True, "measured plain decoding (1000 ms a token plain)")


def test_the_measurement_judges_the_window_before_it():
    """Speculation that was slower than the measured plain decoding pauses as the
    measurement ends, without speculating for another window first."""
    clock = Clock()
    guard = Guard(clock=clock, window=4, first_pause=8)
    guard.allows(0)
    tokens(guard, clock, 0, 5, 1.5)
    clean_runs(guard, clock, 5, 3, 1.0)
    ok, why = guard.allows(8)
    assert not ok and why == ("measured plain decoding; 1500 ms a token speculating > "
                              "1000 ms plain: pause for 8 tokens")
    assert guard.allows(15) == (False, None) and guard.allows(16)[0]


def test_runs_beside_draft_work_are_not_clean():
    """A run out while a draft job begins is timed beside the draft's work: not a plain
    figure; without three clean runs the measuring pause ends after 12 tokens."""
    clock = Clock()
    guard = Guard(clock=clock, window=4)
    guard.allows(0)
    tokens(guard, clock, 0, 5, 0.5)
    for n in range(6, 18):
        guard.sent_alone(n)
        guard.draft_began()
        clock.now += 2.0
        guard.returned(n)
        guard.generated(n)
        assert guard.allows(n)[0] == (n == 17)
    assert guard.plain_s == pytest.approx(2.0)         # the pause's tokens, all it had


def test_a_run_sent_behind_others_is_not_a_plain_figure():
    clock = Clock()
    guard = Guard(clock=clock)
    clock.now += 3.0
    guard.returned(5)            # never sent alone: no figure
    assert guard.plain_s is None


def test_a_phase_that_drafted_little_is_not_judged():
    """Speculation that hardly drafted (no n-gram matched) cost nothing: however slow the
    tokens, it is not paused for them."""
    guard, clock = guard_with_plain(1.0, window=8)
    assert tokens(guard, clock, 0, 40, 1.5, guesses=0) == []
    [why] = tokens(guard, clock, 40, 8, 1.5, guesses=1)   # 8 guesses: now it is judged
    assert "pause for" in why


def test_noise_within_the_margin_is_left_alone():
    guard, clock = guard_with_plain(1.0, window=8)
    assert tokens(guard, clock, 0, 100, 1.02) == []


def test_a_strategy_that_never_asks_is_never_judged():
    """iterative never asks whether to speculate: its tokens make no decisions."""
    clock = Clock()
    guard = Guard(clock=clock, window=4)
    guard.sent_alone(1)
    clock.now += 1.0
    guard.returned(1)
    assert tokens(guard, clock, 0, 40, 5.0) == []
    assert guard.spec_s is None


def test_turned_off_never_pauses():
    guard, clock = guard_with_plain(1.0)
    guard.enabled = False
    assert tokens(guard, clock, 0, 100, 5.0) == []
    assert guard.allows(100) == (True, None)


def speculating(guard: Guard, clock: Clock, start: int, count: int, seconds: float,
                guesses: int = 2) -> list[str]:
    """tokens(), with the scheduler's count of guesses sent going up by `guesses` a token."""
    reasons = []
    for n in range(start + 1, start + count + 1):
        guard.guessed += guesses
        reasons += tokens(guard, clock, n - 1, 1, seconds, guesses=guesses)
    return reasons


def failed_then_probing(window: int = 8) -> tuple[Guard, Clock, int]:
    """A guard whose speculation (2 guesses a token, none accepted, 1.5 s a token against
    plain decoding's 1.0) paused for 16 tokens and now probes: a guess would pay if right
    more often than (1.5 - 1) / 2 + 0 = 0.25."""
    guard, clock = guard_with_plain(1.0, window=window, first_pause=16)
    guard.drafted(0, accepted=0)
    [why] = speculating(guard, clock, 0, window + 1, 1.5, guesses=2)
    assert "pause for 16" in why
    n = window + 1
    tokens(guard, clock, n, 16, 1.0)
    n += 16
    ok, why = guard.allows(n)
    assert ok and "probing" in why
    return guard, clock, n


def test_a_probe_whose_draft_agreed_too_rarely_pauses_again_at_once():
    guard, clock, n = failed_then_probing()
    assert guard.wants_score
    assert guard.scored((8, 4, 1), n, final=False) is None   # an interrupted catch-up
    why = guard.scored((12, 6, 1), n, final=True)
    assert "right on 2 of 10 confident guesses" in why and "0.25 would pay" in why
    assert "pause for 32 tokens" in why                      # as a failed probe: doubled
    assert not guard.wants_score and guard.allows(n + 1) == (False, None)


def test_a_probe_whose_draft_agreed_often_enough_speculates():
    guard, clock, n = failed_then_probing()
    assert guard.scored((20, 10, 5), n, final=True) is None  # 5 / 11 > 0.25
    assert not guard.wants_score and guard.allows(n) == (True, None)


def test_the_draft_s_agreement_adds_up_over_the_pauses():
    """A few confident positions prove little: a second pause's score adds to the first's."""
    guard, clock, n = failed_then_probing()
    why = guard.scored((10, 2, 0), n, final=True)             # 0 of 2: pause again
    assert "pause for 32" in why
    tokens(guard, clock, n, 32, 1.0)
    n += 32
    assert guard.allows(n)[0] and guard.wants_score
    why = guard.scored((30, 4, 1), n, final=True)             # 1 of 6, (1 / 7 < 0.25)
    assert "right on 1 of 6 confident guesses" in why


def test_after_the_longest_pause_the_probe_is_timed_whatever_the_score():
    """A figure from long ago may say no draft could pay (a* over 1): the probe after the
    longest pause speculates and is timed, so that speculation can come back."""
    guard, clock = guard_with_plain(1.0, window=8, first_pause=16, max_pause=32)
    speculating(guard, clock, 0, 9, 3.0, guesses=1)           # a* = (3 - 1) / 1 + 0 = 2
    tokens(guard, clock, 9, 16, 1.0)
    assert guard.allows(25)[0] and guard.wants_score
    assert "pause for 32" in guard.scored((20, 20, 20), 25, final=True)
    tokens(guard, clock, 25, 32, 1.0)
    ok, why = guard.allows(57)
    assert ok and "probing after a pause of 32" in why and not guard.wants_score


def test_no_verdict_without_guesses_sent_or_a_scoring_draft():
    """A phase that sent no guess gives no figure to judge agreement by (the probe goes on
    as before), and a draft that does not score (None) leaves the probe to its timing."""
    guard, clock = guard_with_plain(1.0, window=8, first_pause=16)
    [why] = tokens(guard, clock, 0, 9, 1.5)                   # drafted, guessed nothing
    tokens(guard, clock, 9, 16, 1.0)
    assert guard.allows(25)[0] and not guard.wants_score
    guard, clock, n = failed_then_probing()
    assert guard.scored(None, n, final=True) is None and not guard.wants_score


# --- the guard inside the schedule: real tiny stages, scripted drafts (no MPI) -------------------



from pipeinfer.schedule import core  # noqa: E402
from pipeinfer.schedule.options import SpecOptions  # noqa: E402
from support.rig import check_consistent, run_inprocess  # noqa: E402
from support.scripted_draft import PERFECT, ScriptedDraft, USELESS  # noqa: E402
from support.stepped_transport import SteppedTransport  # noqa: E402

N = 64


DRAFT_COST = 0.5   # the head's time per drafted token, in the pipeline clock's units


class TimedTransport(SteppedTransport):
    """SteppedTransport on a clock: a tick takes as long as its slowest stage, a stage 1 unit
    per decode plus 0.25 per token it evaluates (skipped runs cost nothing)."""

    def __init__(self, stages, clock: Clock, **kw):
        super().__init__(stages, **kw)
        self.clock, self._tick_cost = clock, 0.0

    def tick(self) -> None:
        self._tick_cost = 0.0
        super().tick()
        self.clock.now += self._tick_cost

    def step(self, s: int) -> None:
        tx = self.queues[s][0][0]
        computed = self.cores[s].stats["computed"]
        super().step(s)
        if tx is not None and self.cores[s].stats["computed"] > computed:
            self._tick_cost = max(self._tick_cost, 1.0 + 0.25 * len(tx.positions))


class TimedDraft(ScriptedDraft):
    """ScriptedDraft whose guesses take the head DRAFT_COST each (the head's loop waits for
    its draft: draft_thread=False)."""

    def __init__(self, clock: Clock, *args):
        super().__init__(*args)
        self.clock = clock

    def draft(self, *args, **kw):
        branches, probs = super().draft(*args, **kw)
        self.clock.now += DRAFT_COST * sum(len(b) for b in branches)
        return branches, probs


def go(tiny, monkeypatch, strategy, plans, guard: bool):
    clock = Clock()
    # the scheduler's guard reads the pipeline's clock
    monkeypatch.setattr(core, "Guard", lambda enabled: Guard(enabled, clock=clock))
    spec = SpecOptions(draft_thread=False, p_accept=0.0, p_recovery=0.0, p_decay=0.0,
                       guard=guard)
    out = run_inprocess(tiny, strategy, TimedDraft(clock, tiny.full, tiny.n_vocab, plans),
                        spec=spec, n_predict=N,
                        transport=lambda stages: TimedTransport(stages, clock, lag=1))
    check_consistent(out, tiny.reference, N)   # exact either way
    return out.counters


@pytest.mark.parametrize("strategy", ["speculative", "pipeinfer"])
def test_useless_drafts_pause_speculation(tiny, monkeypatch, strategy):
    """Drafts that are always wrong make tokens slower: with the guard, speculation recedes
    to its probes."""
    off = go(tiny, monkeypatch, strategy, USELESS, False)
    on = go(tiny, monkeypatch, strategy, USELESS, True)
    assert on.n_accepted == off.n_accepted == 0
    assert on.runs_speculative * 2 <= off.runs_speculative, (on, off)
    assert on.runs_speculative > 0        # it probed again after the first pause


@pytest.mark.parametrize("strategy", ["speculative", "pipeinfer"])
def test_good_drafts_cost_one_measurement(tiny, monkeypatch, strategy):
    """Drafts that are always right make tokens faster: the guard pauses once, for the clean
    runs that give it a plain figure (a few tokens), and never again."""
    on = go(tiny, monkeypatch, strategy, PERFECT, True)
    off = go(tiny, monkeypatch, strategy, PERFECT, False)
    assert off.runs_speculative - 6 <= on.runs_speculative < off.runs_speculative
    assert on.n_accepted >= off.n_accepted - 6 * 6


@pytest.mark.parametrize("strategy", ["speculative", "pipeinfer"])
def test_speculation_returns_when_drafts_recover(tiny, monkeypatch, strategy):
    """Useless drafts first (the first jobs), then good ones: the guard pauses, probes, and
    speculation comes back: past the first window, the measurement and one pause (about 32
    tokens), most tokens are accepted drafts."""
    plans = USELESS * 3 + PERFECT * 200
    on = go(tiny, monkeypatch, strategy, plans, True)
    assert on.n_accepted >= (N - 32) * 3 // 4, on


# --- what counts as draft work -----------------------------------------------------------------

from pipeinfer.model.sampling import Sampler, SamplingParams  # noqa: E402
from pipeinfer.schedule.events import DraftInterrupted, DraftReady  # noqa: E402
from pipeinfer.schedule.generation import Generation, Request  # noqa: E402
from pipeinfer.schedule.options import Limits  # noqa: E402
from pipeinfer.schedule.partition_pool import PartitionPool  # noqa: E402
from pipeinfer.schedule.pipeinfer import PipeInfer  # noqa: E402


def test_draft_model_work_that_ships_nothing_counts_its_tokens():
    """A draft job that started no speculative run (its first guess under the cutoff, or
    guesses the target had made meanwhile, or a job no longer wanted) took the head's CPU for
    every token the draft model evaluated: that many units of draft work for the guard, at
    least one; so did a job stopped while it caught up; a lookup's answer costs nothing."""
    gen = Generation(Request(tuple(range(1, 9)), 16, 64, ignore_eos=True), lambda t: False)
    sched = PipeInfer(gen, Sampler(SamplingParams()), Limits(32, 64, 64, 2), SpecOptions(),
                      PartitionPool(4, 8))
    sched.step(DraftReady(7, ((5, 6),), evaluated=9))    # a job the scheduler did not send
    assert sched.guard.drafted_units == 9
    sched.step(DraftReady(8, ()))                         # nothing said: one unit
    sched.step(DraftReady(9, ((5,),), origin="ngram"))
    assert sched.guard.drafted_units == 10
    sched.step(DraftInterrupted(10, evaluated=8))      # stopped while catching up
    assert sched.guard.drafted_units == 18
    sched.step(DraftInterrupted(11))
    assert sched.guard.drafted_units == 18
