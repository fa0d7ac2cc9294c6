"""schedule/adaptive.py: the lanes' pipeinfer, which verifies its drafts in the run of its
own pending token while other generations share the pipeline and is PipeInfer alone. The
schedule is checked event by event (no pipeline: the core is pure); exactness on real ranks
with concurrent requests is tests/test_serve.py's."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from pipeinfer.schedule import actions as A
from pipeinfer.schedule.adaptive import AdaptivePipeInfer
from pipeinfer.schedule.events import DraftInterrupted, DraftReady, Start, Tick
from support.schedule_script import PROMPT, Script, TARGET, make, of

P = len(PROMPT)


class Share:
    """Scheduler.share as engine/head/lanes.py gives it: `on` while others are under way."""

    def __init__(self, sched, on: bool, n_stages: int = 3):
        self.sched, self.on, self.n_stages = sched, on, n_stages
        self.rebuild = False   # a resumed generation is evaluating what it had sent

    def shared(self) -> bool:
        return self.on

    def rebuilding(self) -> bool:
        return self.rebuild

    lag = 0   # context tokens the lane's draft model has still to read

    def draft_lag(self, sched) -> int:
        return self.lag

    def load(self) -> int:
        return self.sched.in_flight + (self.n_stages if self.on else 0)

    def limit(self, max_runs: int) -> int:
        return min(max_runs, self.n_stages) if self.on else max_runs


def adaptive(on: bool, **kw) -> tuple[Script, Share]:
    kw.setdefault("draft", 4)
    sched = make(AdaptivePipeInfer, **kw)
    sched.limits = replace(sched.limits, max_run=3)      # repacked weights' exact limit
    sched.spec.max_run = 3
    share = sched.share = Share(sched, on)
    return Script(sched), share


def answer(s: Script, job, n: int | None = None):
    """The draft's answer to `job`: the target's own continuation (n tokens, default the
    job's budget)."""
    k = len(job.context)
    return s.step(DraftReady(job.job_id, (tuple(TARGET[k:k + (n or job.budget)]),)))


def test_shared_it_drafts_first_then_runs_the_pending_token_with_its_drafts():
    s, _ = adaptive(True, n_predict=12)
    s.step(Start())
    actions = s.finish_oldest()             # the prefill's result: a rooted draft job
    assert not of(actions, A.StartRun)
    job = of(actions, A.StartDraft)[0].job
    assert list(job.context) == TARGET[:P + 1] and job.budget == 2   # max_run 3 - the root
    assert not s.step(Tick())               # while it drafts: nothing else goes out
    run = of(answer(s, job), A.StartRun)[0]
    assert run.tx.speculative and run.tx.positions == (P, P + 1, P + 2)
    assert run.tokens == tuple(TARGET[P:P + 3])
    emitted = of(s.finish_oldest(), A.EmitTokens)[0].tokens
    assert list(emitted) == TARGET[P + 1:P + 4]     # both guesses and the next token
    assert s.sched.rooted_runs == 1


@pytest.mark.parametrize("on", [True, False], ids=["shared", "alone"])
def test_no_draft_work_while_a_resumed_generation_rebuilds(on):
    """After a failure the front resumes requests on a new job: their prompts and sent tokens
    are evaluated again, and every client waits for that. Draft work meanwhile (warming the
    draft model, draft jobs) would take the head's CPU from those runs: it waits."""
    s, share = adaptive(on, n_predict=12)
    share.rebuild = True
    start = s.step(Start())
    assert not of(start, A.WarmDraft) and of(start, A.StartRun)
    actions = s.finish_oldest()             # the prefill's result: a token, no draft job
    assert not of(actions, A.StartDraft)
    for _ in range(3):
        actions = s.step(Tick()) + (s.finish_oldest() if s.sched.in_flight else [])
        assert not of(actions, A.StartDraft)
    share.rebuild = False                   # every resumed generation has its cells back
    later = []
    for _ in range(4):
        later += s.step(Tick()) + (s.finish_oldest() if s.sched.in_flight else [])
    assert of(later, A.StartDraft)



def test_shared_the_pending_token_runs_alone_while_the_draft_catches_up():
    """A resumed request after its rebuild (or a long prompt): its draft model has the whole
    context still to read. A rooted draft job would hold the pending token's run until it had;
    instead the token runs alone and the draft model reads the context meanwhile (WarmDraft,
    once per new context); once it is close behind, the rooted jobs come back."""
    s, share = adaptive(True, n_predict=12)
    share.lag = 100
    s.step(Start())
    actions = s.finish_oldest()             # the prefill's result
    assert not of(actions, A.StartDraft)
    warm = of(actions, A.WarmDraft)
    assert len(warm) == 1 and list(warm[0].tokens) == TARGET[:P + 1]
    run = of(actions, A.StartRun)[0]
    assert not run.tx.speculative and run.tokens == (TARGET[P],)
    assert not of(s.step(Tick()), A.WarmDraft)       # (not again for the same context)
    actions = s.finish_oldest()             # still behind: alone again, warm the new context
    assert not of(actions, A.StartDraft) and of(actions, A.StartRun)
    assert list(of(actions, A.WarmDraft)[0].tokens) == TARGET[:P + 2]
    share.lag = 3                           # caught up: a rooted draft job again
    actions = s.finish_oldest()
    assert of(actions, A.StartDraft) and not of(actions, A.StartRun)

def test_shared_a_whole_generation_is_exact_with_one_run_at_a_time():
    s, _ = adaptive(True, n_predict=20)
    s.step(Start())
    s.finish_oldest()
    while not s.sched.finished:
        job = of(s.log[-1][1], A.StartDraft)[0].job
        answer(s, job, n=1 + len(s.sched.gen.tokens) % 2)   # 1 or 2 right guesses
        assert s.sched.in_flight == 1
        assert not of(s.step(Tick()), A.StartDraft)
        s.finish_oldest()
    assert s.sched.gen.tokens == TARGET[P:P + 20]
    assert s.sched.rooted_runs == s.sched.gen.counters.runs_started - 1   # all but prefill


def test_a_wrong_draft_still_gives_the_pending_token_and_nothing_drafted_runs_it_alone():
    s, _ = adaptive(True, n_predict=10)
    s.step(Start())
    job = of(s.finish_oldest(), A.StartDraft)[0].job
    run = of(s.step(DraftReady(job.job_id, ((1, 2),))), A.StartRun)[0]
    assert len(run.tokens) == 3
    assert list(of(s.finish_oldest(), A.EmitTokens)[0].tokens) == [TARGET[P + 1]]
    job = of(s.log[-1][1], A.StartDraft)[0].job
    run = of(s.step(DraftInterrupted(job.job_id)), A.StartRun)[0]
    assert run.tokens == (TARGET[P + 1],) and run.tx.positions == (P + 1,)


def test_alone_it_is_pipeinfer():
    s, _ = adaptive(False, n_predict=12)
    s.step(Start())
    actions = s.finish_oldest()
    cover = of(actions, A.StartRun)[0]      # the pending token's run goes out at once
    assert not cover.tx.speculative and cover.tx.positions == (P,)
    job = of(s.step(Tick()), A.StartDraft)[0].job
    assert list(job.context) == TARGET[:P + 1]   # continuing the tip, while its run flies
    spec = of(answer(s, job, 2), A.StartRun)[0]
    assert spec.tx.positions == (P + 1, P + 2) and s.sched.in_flight == 2
    assert s.sched.rooted_runs == 0


def test_it_switches_at_run_boundaries_both_ways():
    s, share = adaptive(False, n_predict=30, max_runs=6, n_stages=3)
    s.step(Start())
    s.finish_oldest()
    job = of(s.step(Tick()), A.StartDraft)[0].job
    answer(s, job, 2)                       # alone: a speculative run behind the cover
    job = of(s.step(Tick()), A.StartDraft)[0].job
    share.on = True                         # others arrive
    assert of(s.step(Tick()), A.StopDraft)  # its job would be dropped: stopped
    assert not of(answer(s, job, 2), A.StartRun)    # and its answer is
    assert not of(s.step(Tick()), A.StartDraft)
    while s.flight:                         # PipeInfer's runs come back first
        actions = s.finish_oldest()
    job = of(actions, A.StartDraft)[0].job  # then: rooted at the pending token
    assert list(job.context) == s.sched.gen.accepted and s.flight == []
    answer(s, job)
    share.on = False                        # alone again
    assert of(s.step(Tick()), A.StartDraft) # PipeInfer's next micro-batch behind that run
    assert s.sched.rooted_runs == 1


@pytest.mark.parametrize("seed", range(10))
def test_exact_under_random_timing_and_sharing(seed):
    rng = random.Random(seed)
    s, share = adaptive(rng.random() < 0.5, n_predict=40, max_runs=rng.randint(2, 6),
                        n_stages=rng.randint(1, 4), cancel=rng.random() < 0.7)
    jobs = []
    s.step(Start())
    while not s.sched.finished:
        jobs += [a.job for a in s.log[-1][1] if isinstance(a, A.StartDraft)]
        x = rng.random()
        if x < 0.05:
            share.on = not share.on
        elif x < 0.45 and s.flight:
            s.finish_oldest()
        elif x < 0.75 and jobs:
            job = jobs.pop(0)
            k, n = len(job.context), rng.randint(0, job.budget)
            guess = TARGET[k:k + n] if rng.random() < 0.7 else [1] * n
            s.step(DraftReady(job.job_id, (tuple(guess),) if n else ()))
        else:
            s.step(Tick())
    while s.flight:
        assert not of(s.finish_oldest(), A.EmitTokens)
    assert s.sched.gen.tokens == TARGET[P:P + 40]
    assert s.sched.pool.all_free
