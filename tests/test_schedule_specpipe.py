"""The specpipe schedule on its own: scripted events in, actions out, no MPI, no llama.cpp.

The target is test_schedule's scripted greedy model (the token after position p is
TARGET[p]; results carry argmaxes). The draft is a function (position, token) -> logits of
the token after it, answering every TreeDraftJob. Checked: levels in flight = the pipeline
depth; a hit starts the next level at once (the draft evaluated the newest level while the
pipeline was full); a hit reroots and cancels the runs holding no surviving node; a new root
re-decodes an accepted node whose beam had died; a miss flushes (cancels every live run) and
starts a new root; a result that comes while a draft job is out waits for it; the greedy
tokens come out exactly under random timing; at the end every slot is emptied and the
partition comes back.
"""

from __future__ import annotations

import random
import subprocess
import sys
from collections import deque

import numpy as np
import pytest

from pipeinfer.schedule.partition_pool import PartitionPool
from pipeinfer.schedule import actions as A
from pipeinfer.schedule.events import Cancel, ResultArrived, Start, Tick
from pipeinfer.schedule.generation import Generation, Request
from pipeinfer.schedule.options import Limits, SpecOptions
from pipeinfer.schedule.specpipe import SpecPipe
from pipeinfer.schedule.tree_draft import StartTreeDraft, TreeDraftReady
from pipeinfer.schedule.transaction import KvOpType, RunResult
from support.schedule_script import PROMPT, TARGET, of, result_for

V = 1024
P = len(PROMPT)   # the root of the first tree: the first generated token


def logits(*ranked: int, top: float = 10.0, step: float = 1.0) -> np.ndarray:
    z = np.zeros(V, dtype=np.float32)
    for rank, t in enumerate(ranked):
        z[t] = top - rank * step
    return z


def aligned(pos: int, token: int) -> np.ndarray:
    """The target's next token first (a wrong second guess after it)."""
    return logits(TARGET[pos + 1], 900 + pos % 50)


def unrelated(pos: int, token: int) -> np.ndarray:
    return logits(700 + pos % 50, 800 + pos % 50)


def mixed(seed: int):
    def draft(pos: int, token: int) -> np.ndarray:
        rng = random.Random(seed * 100_003 + pos * 1_009 + token)
        guesses = [TARGET[pos + 1], 700 + rng.randrange(50), 800 + rng.randrange(50)]
        if rng.random() < 0.4:
            rng.shuffle(guesses)
        return logits(*guesses)
    return draft


def make(width=3, k=2, n_stages=3, n_predict=30, **opts):
    spec = SpecOptions(tree_width=width, tree_k=k, **opts)
    gen = Generation(Request(PROMPT, n_predict, 512), lambda t: False)
    return SpecPipe(gen, None, Limits(64, 512, 2048, n_stages), spec, PartitionPool(1, width))


class Sim:
    """Feeds events; keeps the runs in flight (oldest first), the cancelled ones, and the
    draft's answers to the jobs sent, until they are delivered."""

    def __init__(self, sched: SpecPipe, draft):
        self.sched, self.draft = sched, draft
        self.flight: list[A.StartRun] = []
        self.cancelled: set[int] = set()
        self.answers: deque[TreeDraftReady] = deque()
        self.jobs = []

    def step(self, event) -> list:
        actions = self.sched.step(event)
        for a in actions:
            if isinstance(a, A.StartRun):
                self.flight.append(a)
            elif isinstance(a, A.CancelRuns):
                self.cancelled.update(a.run_ids)
            elif isinstance(a, StartTreeDraft):
                self.jobs.append(a.job)
                self.answers.append(self.answer(a.job))
        return actions

    def answer(self, job) -> TreeDraftReady:
        rows = [self.draft(pos, token) for _, pos, token in job.decodes]
        if job.sync is not None:
            rows.append(self.draft(len(job.sync) - 1, job.sync[-1]))
        return TreeDraftReady(job.job_id, (), rows=tuple(rows))

    def finish_oldest(self, computed: bool = False) -> list:
        """The oldest run's result; a cancelled run comes back empty unless `computed`."""
        start = self.flight.pop(0)
        if start.run_id in self.cancelled and not computed:   # skipped by a stage
            return self.step(ResultArrived(start.run_id, RunResult(start.run_id, None)))
        return self.step(result_for(start))

    def deliver(self) -> list:
        return self.step(self.answers.popleft())

    def settle_drafts(self) -> None:
        """Deliver draft answers and tick until nothing new happens."""
        while self.answers or of(self.step(Tick()), A.StartRun):
            if self.answers:
                self.deliver()

    def start(self) -> None:
        self.step(Start())
        self.finish_oldest()   # the prompt: the first token, a root


def live_ids(sched) -> list[int]:
    return [r.run_id for r in sched.spec.live()]


@pytest.mark.parametrize("n_stages,max_runs", [(1, 6), (2, 6), (3, 6), (5, 6), (5, 3)])
def test_levels_in_flight_equal_pipeline_depth(n_stages, max_runs):
    s = Sim(make(n_stages=n_stages, max_runs=max_runs), aligned)
    depth = max(2, min(max_runs, n_stages + 1))
    s.start()
    s.settle_drafts()
    assert s.sched.in_flight == len(live_ids(s.sched)) == depth
    assert not of(s.step(Tick()), A.StartRun)
    # the newest level was evaluated while the pipeline was full: a hit starts the next
    # level in the same step, without waiting for the draft
    newest = s.flight[-1]
    assert s.jobs[-1].decodes and s.jobs[-1].decodes[0][1] == max(newest.tx.positions)
    starts = of(s.finish_oldest(), A.StartRun)
    assert len(starts) == 1 and starts[0].tx.speculative
    assert s.sched.gen.counters.tree_hits == 1 and s.sched.in_flight == depth


def test_hit_reroots_and_cancels_runs_holding_no_surviving_node():
    """width 2: the root's children a (right) and b (wrong, about as likely); b's children
    are far likelier than a's, so level 2 and 3 hang off b alone and a's beam dies. The hit
    on a cancels exactly those levels; a, dead, is decoded again by the next root."""
    a, b = TARGET[P + 1], 600

    def draft(pos, token):
        if pos == P:
            return logits(a, b, step=0.01)
        if token == b or pos > P + 1:
            return logits(601 + pos, 650 + pos, top=20.0)
        return logits(TARGET[pos + 1], 680, top=1.0, step=0.1)   # after a: unsure

    s = Sim(make(width=2, k=2, n_stages=3, n_predict=10), draft)
    s.start()
    s.settle_drafts()
    chain, level1, level2, level3 = s.flight
    assert level1.tokens == (a, b) and b not in level2.tokens
    assert set(level2.tx.seq_ids) == {(s.sched.slots[0],), (s.sched.slots[1],)}
    actions = s.finish_oldest()   # the root's run: the target says a
    assert [c.run_ids for c in of(actions, A.CancelRuns)] == [(level2.run_id,
                                                                level3.run_id)]
    c = s.sched.gen.counters
    assert c.tree_hits == 1 and c.runs_cancelled_invalidated == 2 and c.flushes == 0
    assert level1.run_id in live_ids(s.sched)
    # a's beam died before the hit: sequence 0 did not get its entry
    assert not of(actions, A.KvOps)
    actions = s.finish_oldest()   # level 1: a has no child (nothing speculated: no flush)
    assert c.flushes == 0 and s.sched.gen.tokens == TARGET[P:P + 3]
    root_run = of(actions, A.StartRun)[0]
    assert root_run.tx.positions == (P + 1, P + 2) and root_run.tokens == (a, TARGET[P + 2])
    assert root_run.tx.logit_rows == (False, True) and not root_run.tx.speculative
    ops = [op for k in of(actions, A.KvOps) for op in k.ops]
    assert ops[-1].kind == KvOpType.KV_SEQ_CP and (ops[-1].seq, ops[-1].p1) == (0, P + 1)


def test_miss_flushes_every_live_run_and_starts_a_new_root():
    s = Sim(make(width=3, k=2, n_stages=2, n_predict=12), unrelated)
    s.start()
    s.settle_drafts()
    levels = live_ids(s.sched)[1:]
    assert len(levels) == 2
    actions = s.finish_oldest()   # the root's run: a miss
    assert [c.run_ids for c in of(actions, A.CancelRuns)] == [tuple(levels)]
    assert not live_ids(s.sched)[1:] and s.sched.gen.counters.flushes == 1
    root = of(actions, A.StartRun)[0]
    assert root.tx.positions == (P + 1,) and root.tx.seq_ids == ((0, s.sched.slots[0]),)
    sync = of(actions, StartTreeDraft)[0].job.sync
    assert sync == tuple(TARGET[:P + 2])


def test_results_wait_for_the_job_out():
    """A fast pipeline returns the new root's result before the draft's answer is polled:
    the result waits, the level goes in first, then the result is verified (else the root
    would never have a level in flight)."""
    s = Sim(make(width=2, k=2, n_stages=2, n_predict=12), unrelated)
    s.start()
    assert s.answers and not of(s.finish_oldest(), A.EmitTokens)   # the root's result waits
    actions = s.deliver()
    kinds = [type(a) for a in actions]
    level = of(actions, A.StartRun)[0]
    assert level.tx.speculative and level.tx.positions == (P + 1, P + 1)
    assert kinds.index(A.StartRun) < kinds.index(A.EmitTokens) < kinds.index(A.CancelRuns)
    assert of(actions, A.CancelRuns)[0].run_ids == (level.run_id,)   # a miss: flushed
    assert s.sched.gen.counters.flushes == 1


@pytest.mark.parametrize("seed", range(12))
def test_greedy_tokens_exact_under_random_timing(seed):
    rng = random.Random(seed)
    width, k = rng.randint(1, 4), rng.randint(1, 3)
    sched = make(width=width, k=k, n_stages=rng.randint(1, 4), n_predict=40,
                 max_runs=rng.randint(2, 6), cancel=rng.random() < 0.7)
    s = Sim(sched, rng.choice([aligned, unrelated, mixed(seed)]))
    s.step(Start())
    while not sched.finished:
        x = rng.random()
        if x < 0.4 and s.flight:
            s.finish_oldest(computed=rng.random() < 0.5)
        elif x < 0.7 and s.answers:
            s.deliver()
        else:
            s.step(Tick())
        _check_runs(sched)
    end = s.step(Tick())
    while s.flight:
        assert not of(s.finish_oldest(), A.EmitTokens)   # drained, discarded
    tokens = sched.gen.tokens
    assert tokens == TARGET[P:P + 40]
    c = sched.gen.counters
    assert c.tree_steps == len(tokens) - 1 and c.tree_hits + c.flushes <= c.tree_steps
    assert c.n_accepted == c.tree_hits <= c.n_drafted
    assert sched.pool.all_free and not end


def _check_runs(sched) -> None:
    """Every live tree level beyond the accepted node holds a node of the tree."""
    if sched.finished or not sched.prefilled:
        return
    tree, p = sched.tree, sched.gen.pending
    for run in sched.spec.live():
        if run.tree_ids and run.max_pos > p:
            assert any(n in tree.nodes for n in run.tree_ids), run.describe()


def test_end_empties_every_slot_and_returns_the_partition():
    s = Sim(make(width=3, n_stages=3, n_predict=5), aligned)
    s.start()
    while not s.sched.finished:
        s.settle_drafts()
        actions = s.finish_oldest()
    finish = actions.index(of(actions, A.Finish)[0])
    clear = [op for a in of(actions[:finish], A.KvOps) for op in a.ops]
    rm = {op.seq for op in clear if op.kind == KvOpType.KV_SEQ_RM}
    assert rm == set(s.sched.slots)
    job = of(actions, StartTreeDraft)[-1].job
    assert {op.seq for op in job.ops} == {1, 2, 3} and not job.decodes
    assert s.sched.pool.all_free   # every stage clears the slots before any later use
    while s.flight:
        s.finish_oldest()
    assert s.sched.in_flight == 0


def test_cancel_during_prefill_returns_the_partition():
    s = Sim(make(), aligned)
    s.step(Start())
    assert of(s.step(Cancel()), A.Finish)
    s.finish_oldest()
    assert s.sched.pool.all_free and not s.jobs


def test_actions_print_short():
    s = Sim(make(), aligned)
    s.start()
    text = " ".join(map(repr, [*s.jobs, *s.answers]))
    assert "TreeDraftJob(0: 0 op(s), 0 decode(s), sync to 5 tokens)" in text
    assert "TreeDraftReady(job=0, rows=1)" in text


def test_specpipe_schedule_imports_neither_mpi_nor_llama():
    code = ("import sys, pipeinfer.schedule.specpipe; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('mpi4py', 'llama_cpp')]; "
            "print(bad); sys.exit(1 if bad else 0)")
    subprocess.run([sys.executable, "-c", code], check=True)
