"""The scheduler core on its own: scripted events in, actions out, no MPI and no llama.cpp.

Each policy gets a test of its own (exactness cannot catch a policy that does nothing): the
cutoff rises per speculative run started, resets when a speculative run is accepted, decays
once per failed draft attempt and stops at its floor; micro-batches end early exactly when a
stage would idle; invalidated and superfluous runs are cancelled; the non-continuous ablation
never has two speculative runs in flight. The "target" here is a scripted greedy model: the
token after position p is TARGET[p]; results carry argmaxes, as greedy workers send them
(support/schedule_script.py).
"""

from __future__ import annotations

import random
import sys

import pytest

from pipeinfer.schedule import actions as A
from pipeinfer.schedule.cutoff import Cutoff
from pipeinfer.schedule.events import Cancel, DraftInterrupted, DraftReady, Start, Tick
from pipeinfer.schedule.iterative import Iterative
from pipeinfer.schedule.pipeinfer import PipeInfer
from pipeinfer.schedule.speculative import Speculative
from support.schedule_script import PROMPT, Script, TARGET, make, of


def test_cutoff_policy_alone():
    c = Cutoff(p_accept=0.3, p_recovery=0.05, p_decay=0.1, floor=0.1)
    assert c.value == pytest.approx(0.3)
    assert c.run_started() and c.run_started()
    assert c.value == pytest.approx(0.4)
    assert c.accepted() and c.value == pytest.approx(0.3)
    assert not c.accepted()                        # already at p_accept
    assert c.attempt_failed() and c.value == pytest.approx(0.2)
    assert c.attempt_failed() and c.value == pytest.approx(0.1)
    assert not c.attempt_failed() and c.value == pytest.approx(0.1)   # the floor holds
    assert Cutoff(0.05, 0.0, 0.1, floor=0.1).floor == 0.05  # never above p_accept


def test_cutoff_decays_once_per_failed_attempt_down_to_the_floor():
    """Failed draft attempts lower the cutoff one p_decay each; ticks in between change
    nothing; at the floor the same attempt is not repeated (no spinning on the draft)."""
    s = Script(make(p_accept=0.3, p_decay=0.05, p_floor=0.1))
    s.prefill()
    attempts = []
    for _ in range(12):
        starts = of(s.step(Tick()), A.StartDraft)
        for _ in range(5):  # idle ticks while the job is out: no decay
            assert not of(s.step(Tick()), A.PolicyChanged)
        if not starts:
            break
        attempts.append(starts[0].job.cutoff)
        s.step(DraftReady(starts[0].job.job_id, ()))
    assert attempts == pytest.approx([0.3, 0.25, 0.2, 0.15, 0.1])
    assert s.cutoffs == pytest.approx([0.25, 0.2, 0.15, 0.1])
    assert not of(s.step(Tick()), A.StartDraft)


def test_interrupted_draft_is_not_a_failed_attempt():
    s = Script(make(p_accept=0.3, p_decay=0.05))
    s.prefill()
    job = of(s.step(Tick()), A.StartDraft)[0].job
    assert not of(s.step(DraftInterrupted(job.job_id)), A.PolicyChanged)
    again = of(s.step(Tick()), A.StartDraft)[0].job
    assert again.cutoff == job.cutoff and again.job_id != job.job_id


@pytest.mark.parametrize("micro_batch", [1, 2])
def test_cutoff_rises_per_run_started_and_resets_on_acceptance(micro_batch):
    """(A one-token run accepted counts: its root guess was the accepted token.)"""
    s = Script(make(p_accept=0.3, p_recovery=0.05, max_runs=8, n_stages=8))
    s.prefill()
    for k in range(3):
        job = of(s.step(Tick()), A.StartDraft)[0].job
        assert job.cutoff == pytest.approx(0.3 + 0.05 * k)
        n = len(job.context)
        s.step(DraftReady(job.job_id, (tuple(TARGET[n:n + micro_batch]),)))
    assert s.cutoffs == pytest.approx([0.35, 0.4, 0.45])
    s.finish_oldest()                       # the non-speculative run: no reset
    assert s.cutoffs[-1] == pytest.approx(0.45)
    s.finish_oldest()                       # a speculative run, accepted
    assert s.cutoffs[-1] == pytest.approx(0.3)


def test_microbatch_ends_early_exactly_when_a_stage_would_idle():
    """With a job out, a tick stops it iff fewer runs are in flight than target stages."""
    for n_stages in (2, 3, 4):
        s = Script(make(n_stages=n_stages, max_runs=8))
        s.prefill()                          # one run (non-speculative) in flight now
        while True:
            job = of(s.step(Tick()), A.StartDraft)[0].job
            stops = of(s.step(Tick()), A.StopDraft)
            in_flight = s.sched.in_flight
            assert bool(stops) == (in_flight < n_stages), (n_stages, in_flight)
            assert not any(stop.stale for stop in stops)   # its tokens are wanted
            assert not of(s.step(Tick()), A.StopDraft)  # said once
            n = len(job.context)
            s.step(DraftReady(job.job_id, (tuple(TARGET[n:n + 1]),)))
            if in_flight >= n_stages:
                break


def test_no_continuous_never_has_two_speculative_runs_in_flight():
    rng = random.Random(3)
    s = Script(make(continuous=False, max_runs=6, n_stages=4, n_predict=60))
    s.prefill()
    job = None
    while not s.sched.finished:
        choice = rng.random()
        if choice < 0.3 and s.flight:
            s.finish_oldest()
        elif choice < 0.6 and job is not None:
            n = len(job.context)
            guess = tuple(TARGET[n:n + 3]) if rng.random() < 0.7 else (999, 998)
            s.step(DraftReady(job.job_id, (guess,)))
            job = None
        else:
            starts = of(s.step(Tick()), A.StartDraft)
            job = starts[0].job if starts else job
        spec_live = [r for r in s.sched.spec.live() if r.speculative]
        assert len(spec_live) <= 1
        assert s.sched.in_flight <= 6
    assert s.sched.gen.tokens == TARGET[len(PROMPT):len(PROMPT) + 60]


def test_invalidated_and_superfluous_runs_are_cancelled():
    """A speculative run built on a wrong guess is cancelled when the guess is rejected; a
    run whose positions were all accepted meanwhile is dropped as superfluous."""
    s = Script(make(max_runs=8, n_stages=8))
    s.prefill()
    n = len(PROMPT) + 1                      # tokens accepted so far (prompt + first)
    job = of(s.step(Tick()), A.StartDraft)[0].job
    s.step(DraftReady(job.job_id, ((777, 778),)))      # wrong from its first token
    bad = s.flight[-1].run_id
    job = of(s.step(Tick()), A.StartDraft)[0].job      # continues the wrong guess
    s.step(DraftReady(job.job_id, ((779,),)))
    worse = s.flight[-1].run_id
    actions = s.finish_oldest()              # the main run: the target's token is not 777
    cancels = [i for a in of(actions, A.CancelRuns) for i in a.run_ids]
    assert bad in cancels and worse in cancels
    assert s.sched.gen.counters.runs_cancelled_invalidated == 2
    assert s.sched.gen.tokens == TARGET[len(PROMPT):n + 1]


def test_a_job_continuing_a_rejected_guess_is_stopped_as_stale():
    """The job out continues a speculation the target has just rejected: it is stopped as
    stale (its draft step under way may be aborted), and the next job starts from the
    target's token."""
    s = Script(make(max_runs=8, n_stages=8))
    s.prefill()
    job = of(s.step(Tick()), A.StartDraft)[0].job
    s.step(DraftReady(job.job_id, ((777,),)))          # wrong
    job = of(s.step(Tick()), A.StartDraft)[0].job      # continues the wrong guess
    stops = of(s.finish_oldest(), A.StopDraft)         # the target's token is not 777
    assert stops == [A.StopDraft(job.job_id, stale=True)]
    s.step(DraftInterrupted(job.job_id))               # (its step aborted: nothing drafted)
    again = of(s.step(Tick()), A.StartDraft)[0].job
    assert list(again.context) == list(s.sched.gen.accepted)


def test_superfluous_run_is_cancelled():
    """A run whose every position got accepted by an older run is dropped (and cancelled):
    here a speculative run rooted at the pending position, beside the main run of it."""
    s = Script(make(max_runs=8, n_stages=8))
    s.prefill()
    spec = s.sched.spec
    accepted = spec.accepted
    spec.start_speculative(accepted[:-1], [[accepted[-1]]], None)
    s.flight += of(spec.take(), A.StartRun)
    doomed = s.flight[-1].run_id
    actions = s.finish_oldest()              # the main run accepts the next token
    assert doomed in [i for a in of(actions, A.CancelRuns) for i in a.run_ids]
    assert s.sched.gen.counters.runs_cancelled_superfluous == 1
    assert not s.finish_oldest()             # its result is dropped


def test_iterative_is_one_run_at_a_time():
    s = Script(make(Iterative, n_predict=10))
    s.prefill()
    while not s.sched.finished:
        assert s.sched.in_flight == 1
        assert not of(s.step(Tick()), A.StartRun)
        s.finish_oldest()
    assert s.sched.gen.tokens == TARGET[len(PROMPT):len(PROMPT) + 10]
    assert of(s.log[-1][1], A.Finish)[0].reason == "length"


def test_speculative_drafts_then_verifies():
    s = Script(make(Speculative, n_predict=12, draft=3))
    s.step(Start())
    assert of(s.log[0][1], A.WarmDraft)
    s.finish_oldest()
    while not s.sched.finished:
        job = of(s.log[-1][1], A.StartDraft)[0].job
        n = len(job.context)
        s.step(DraftReady(job.job_id, (tuple(TARGET[n:n + job.budget]),)))
        assert s.sched.in_flight == 1
        s.finish_oldest()
    assert s.sched.gen.tokens == TARGET[len(PROMPT):len(PROMPT) + 12]


def test_free_tokens_fill_the_run_not_the_draft_limit():
    """A job's `room` (how far tokens that cost no draft step, a grammar's forced text, may
    take a branch) is the run's limit, not --draft's: speculative leaves the pending token
    its place in the run, pipeinfer does not need to; the model's own steps keep --draft."""
    s = Script(make(Speculative, n_predict=12, draft=2))
    s.prefill()
    job = of(s.log[-1][1], A.StartDraft)[0].job
    assert (job.budget, job.room, job.free_room) == (2, 6, 6)   # max_run 7, root 1
    n = len(job.context)
    run = of(s.step(DraftReady(job.job_id, (tuple(TARGET[n:n + 6]),))), A.StartRun)[0]
    assert len(run.tokens) == 7                    # the pending token and 6 drafts
    s.finish_oldest()
    assert s.sched.gen.tokens[:8] == TARGET[len(PROMPT):len(PROMPT) + 8]
    p = Script(make(PipeInfer, n_predict=12, draft=2))
    p.prefill()
    p.step(Tick())
    job = of(p.log[-1][1], A.StartDraft)[0].job
    assert job.budget <= 2 and job.room == 7


def test_cancel_event_finishes_and_drains():
    s = Script(make(max_runs=8, n_stages=8))
    s.prefill()
    job = of(s.step(Tick()), A.StartDraft)[0].job
    s.step(DraftReady(job.job_id, (tuple(TARGET[6:8]),)))
    assert of(s.step(Cancel()), A.Finish)[0].reason == "cancelled"
    while s.flight:
        assert not s.finish_oldest()         # results after the end are discarded
    assert s.sched.in_flight == 0 and s.sched.pool.all_free


def test_events_and_actions_print_short():
    s = Script(make())
    actions = s.step(Start())
    text = " ".join(map(repr, actions))
    assert "StartRun(run=0 main pos 0..3 n=4)" in text and len(text) < 200


def test_core_imports_neither_mpi_nor_llama():
    import subprocess
    code = ("import sys, pipeinfer.schedule.pipeinfer, pipeinfer.schedule.speculative, "
            "pipeinfer.schedule.iterative; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('mpi4py', 'llama_cpp')]; "
            "print(bad); sys.exit(1 if bad else 0)")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_pipespec_feeds_the_target_from_the_last_draft_buffer():
    """PipeSpec's policy: the drafts follow the accepted tokens (SyncDrafts after every
    result); with at most one run in flight a single proposed token goes out at once
    (lookahead 0), with more in flight only a full --draft window; the run rooted at the
    pending token carries the proposal after it; DraftsDone before Finish."""
    from pipeinfer.schedule.events import DraftsStepped
    from pipeinfer.schedule.pipespec import PipeSpec

    s = Script(make(PipeSpec, n_predict=20, draft=3, max_runs=6))
    start = s.step(Start())
    assert of(start, A.SyncDrafts)[0].reset
    s.finish_oldest()                        # prefill: first token, then a main run
    p = len(PROMPT) + 1
    assert of(s.log[-1][1], A.SyncDrafts)[0].accepted == tuple(TARGET[:p])
    s.step(DraftsStepped(tuple(TARGET[:p + 1])))      # one token beyond: goes out at once
    assert s.sched.in_flight == 2 and s.flight[-1].tx.n_tokens == 1
    s.step(DraftsStepped(tuple(TARGET[:p + 3])))      # two more: not a full window of 3
    assert s.sched.in_flight == 2
    s.step(DraftsStepped(tuple(TARGET[:p + 4])))      # three more: a window
    assert s.sched.in_flight == 3 and s.flight[-1].tx.n_tokens == 3
    while not s.sched.finished:
        actions = s.finish_oldest()
        assert of(actions, A.SyncDrafts) or of(actions, A.Finish)
        if s.sched.in_flight == 0 and not s.sched.finished:
            raise AssertionError("no run evaluates the pending token")
    done = of(s.log[-1][1], A.DraftsDone)
    assert done and s.log[-1][1].index(done[0]) < s.log[-1][1].index(of(s.log[-1][1],
                                                                          A.Finish)[0])
    assert s.sched.gen.tokens == TARGET[len(PROMPT):len(PROMPT) + 20]
