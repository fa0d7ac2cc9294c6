"""The head's speculation scheduler against real llama.cpp stages, in one process.

The `speculative` and `pipeinfer` strategies drive a Pipeline whose head evaluates the first
target layers (or none) and whose transport evaluates the rest (tests/support/rig.py).
`SteppedTransport` (tests/support/stepped_transport.py) models the MPI worker pipeline: one
FIFO of transactions per worker stage, each stage applying them in issue order through the
worker's own StageCore (a cancellation skips a run on every stage that has not started it
yet, or aborts it mid-decode through llama.cpp's abort callback), a result returning only
after the last stage computed it. How far the pipeline advances per poll of the head is
scripted, so results arrive while the head speculates, and runs get cancelled part-way down
the pipeline.

Whatever the timing, drafts, branches and cancellations, greedy output must equal the
single-node greedy reference token for token. Property-based tests drive the scheduler with
scripted drafts (right, or wrong at chosen places, with chosen branches) and scripted pipeline
timing, or with the real drafter under random options. The bookkeeping pieces (run.py's
classification and token trees, the partition pool) have unit tests at the end.
"""

from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import replace
from typing import Sequence

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from pipeinfer.engine.worker.local import LocalTransport
from pipeinfer.model.stage import Stage, StageConfig
from pipeinfer.schedule.options import SpecOptions
from pipeinfer.schedule.partition_pool import PartitionPool
from pipeinfer.schedule.runs import Node, Run, RunState, tree_from_branches
from support.rig import check_consistent, run_inprocess
from support.scripted_draft import PERFECT, USELESS, ScriptedDraft, draft_plans
from support.stepped_transport import SteppedTransport
from support.tiny_set import N_BATCH, N_CTX

SPEC_STRATEGIES = ("speculative", "pipeinfer")


def test_target_is_batch_invariant(tiny):
    """The premise of every exactness test here: a token's logits do not depend on how it
    is batched (alone, in a chain, or in a token tree over copied sequences)."""
    prompt = list(tiny.full[:20])
    config = StageConfig(n_ctx=N_CTX, n_batch=N_BATCH, n_seq_max=4)
    with Stage(tiny.target, config, final=True) as stage:
        single = []
        for i, t in enumerate(prompt):
            single.append(stage.decode([i], [(0,)], tokens=[t])[-1])
        stage.clear()
        chain = np.concatenate([stage.decode(list(range(i, i + 4)), [(0,)] * 4,
                                             tokens=prompt[i:i + 4]) for i in range(0, 20, 4)])
        stage.clear()
        for i in range(10):
            stage.decode([i], [(0,)], tokens=[prompt[i]])
        stage.seq_cp(0, 1)
        stage.seq_cp(0, 2)
        tree = stage.decode([10, 11, 11], [(1, 2), (1,), (2,)],
                            tokens=[prompt[10], prompt[11], (prompt[11] + 1) % tiny.n_vocab])
    assert np.array_equal(np.array(single), chain)
    assert np.array_equal(tree[0], single[10]) and np.array_equal(tree[1], single[11])


# --- 1. real drafts, timing from the transport ------------------------------------------------

DRAFTS = ("aligned", "unrelated")


@pytest.mark.parametrize("draft", DRAFTS)
@pytest.mark.parametrize("strategy", SPEC_STRATEGIES)
@pytest.mark.parametrize("delay", [0, 1, 2, 3])
def test_local_transport_exact(tiny, strategy, draft, delay):
    """The stock LocalTransport (whole worker pipeline per step) at every delay."""
    out = run_inprocess(tiny, strategy, getattr(tiny, draft),
                        transport=lambda stages: LocalTransport(stages, delay=delay))
    check_consistent(out, tiny.reference)
    if strategy == "speculative":
        assert out.counters.runs_speculative > 0


@pytest.mark.parametrize("draft", DRAFTS)
@pytest.mark.parametrize("strategy", SPEC_STRATEGIES)
@pytest.mark.parametrize("head_layers", [0, 1])
@pytest.mark.parametrize("lag", [0, 1, 2, 3])
@pytest.mark.parametrize("abort", [False, True], ids=["skip", "abort"])
def test_stepped_pipeline_exact(tiny, strategy, draft, head_layers, lag, abort):
    """Results arrive while the head speculates: `lag` idle polls per pipeline tick. (The
    abort variants also return argmaxes only, as greedy workers do.)"""
    spec = SpecOptions(draft_thread=False, n_parallel=2, p_split=0.1, guard=False)
    out = run_inprocess(tiny, strategy, getattr(tiny, draft), spec=spec,
                        head_layers=head_layers,
                        transport=lambda stages: SteppedTransport(stages, lag=lag, abort=abort,
                                                                  argmax=abort))
    check_consistent(out, tiny.reference)
    c = out.counters
    if strategy == "speculative":
        assert c.runs_speculative > 0
    else:
        assert c.runs_speculative > 0
        if draft == "unrelated":
            assert c.runs_cancelled_invalidated > 0
            assert out.total("skipped") + out.total("aborted") > 0
            if abort:
                assert out.total("aborted") > 0


@pytest.mark.parametrize("draft", DRAFTS)
@pytest.mark.parametrize("head_layers", [0, 1])
@pytest.mark.parametrize("transport", ["local-0", "local-2", "stepped-1", "stepped-3-abort"])
@pytest.mark.parametrize("continuous", [True, False])
def test_draft_thread_exact(tiny, draft, head_layers, transport, continuous):
    """pipeinfer with the draft model on a thread of its own (the CLI's default): results
    are absorbed while micro-batches are drafted, jobs go stale or are rebased onto the
    newest speculation; the timing is the threads', the output must not depend on it."""
    kind, lag, *abort = transport.split("-")
    make = ((lambda st: LocalTransport(st, delay=int(lag))) if kind == "local" else
            (lambda st: SteppedTransport(st, lag=int(lag), abort=bool(abort),
                                         argmax=bool(abort))))
    spec = SpecOptions(draft_thread=True, continuous=continuous, n_parallel=2, p_split=0.1)
    out = run_inprocess(tiny, "pipeinfer", getattr(tiny, draft), spec=spec,
                        head_layers=head_layers, transport=make)
    check_consistent(out, tiny.reference)


@pytest.mark.parametrize("n_predict", [1, 2, 5])
def test_draft_thread_few_tokens(tiny, n_predict):
    """Generation over while the thread may still be warming up or drafting: it is stopped
    and joined, and the output is exact."""
    out = run_inprocess(tiny, "pipeinfer", tiny.aligned, spec=SpecOptions(draft_thread=True),
                        n_predict=n_predict, transport=lambda st: LocalTransport(st, delay=1))
    check_consistent(out, tiny.reference, n_predict)


def test_draft_thread_speculates(tiny):
    """With a pipeline slower than a draft step, threaded drafting starts speculative runs
    whose tokens are accepted (a slow transport: every poll sleeps)."""
    class Slow(LocalTransport):
        def poll_result(self):
            time.sleep(0.004)
            return super().poll_result()

    out = run_inprocess(tiny, "pipeinfer", tiny.aligned, spec=SpecOptions(draft_thread=True),
                        transport=lambda st: Slow(st, delay=2))
    check_consistent(out, tiny.reference)
    assert out.counters.runs_speculative > 0 and out.counters.n_accepted > 0


@pytest.mark.parametrize("continuous,cancel", [(False, True), (True, False), (False, False)])
def test_pipeinfer_ablations_exact(tiny, continuous, cancel):
    spec = SpecOptions(draft_thread=False, continuous=continuous, cancel=cancel, guard=False)
    for draft in (tiny.aligned, tiny.unrelated):
        out = run_inprocess(tiny, "pipeinfer", draft, spec=spec,
                            transport=lambda stages: SteppedTransport(stages, lag=2))
        check_consistent(out, tiny.reference)
        if not cancel:
            assert out.total("skipped") == out.total("aborted") == 0
            assert out.transport.cancel_msgs == 0
        if not continuous:
            assert out.counters.runs_speculative > 0


def test_pipeinfer_saves_work_in_process(tiny):
    """Cancelling invalidated runs skips stage computations that --no-cancel performs."""
    # (the guard off: it times tokens in real time, and both runs must schedule alike)
    spec = SpecOptions(draft_thread=False, p_accept=0.0, p_recovery=0.0, p_decay=0.0, max_runs=4,
                       guard=False)
    runs = {}
    for cancel in (True, False):
        runs[cancel] = run_inprocess(
            tiny, "pipeinfer", tiny.unrelated, spec=replace(spec, cancel=cancel),
            transport=lambda stages: SteppedTransport(stages, lag=3))
        check_consistent(runs[cancel], tiny.reference)
    with_cancel, without = runs[True], runs[False]
    # the scripted timing makes both runs schedule the same runs
    assert with_cancel.counters.runs_started == without.counters.runs_started
    assert with_cancel.total("skipped") > 0
    assert with_cancel.total("computed") < without.total("computed")


@pytest.mark.parametrize("strategy", SPEC_STRATEGIES)
def test_end_of_generation_stops_exactly(tiny, strategy):
    """Tokens after an end-of-generation token are never accepted, even when a verified
    draft continued past it."""
    k = next(i for i in range(6, len(tiny.reference)) if tiny.reference[i] not in
             tiny.reference[:i])
    eog = tiny.reference[k]
    for draft in (tiny.aligned, tiny.unrelated):
        out = run_inprocess(tiny, strategy, draft, eog=lambda t: t == eog,
                            transport=lambda stages: SteppedTransport(stages, lag=2))
        assert out.gen.stop_reason == "eos"
        assert out.gen.tokens == list(tiny.reference[:k + 1])
        assert out.pool.all_free


@pytest.mark.parametrize("n_predict", [1, 2, 3])
@pytest.mark.parametrize("strategy", SPEC_STRATEGIES)
def test_few_tokens(tiny, strategy, n_predict):
    out = run_inprocess(tiny, strategy, tiny.aligned, n_predict=n_predict,
                        transport=lambda stages: SteppedTransport(stages, lag=1))
    check_consistent(out, tiny.reference, n_predict)


@pytest.mark.parametrize("strategy", SPEC_STRATEGIES)
def test_prompt_longer_than_batch(tiny, strategy):
    """A prompt prefilled in several chunks (n_batch 64); greedy continuations of a prefix
    of the reference are the rest of the reference."""
    n_prompt = N_BATCH + 20
    prompt = tiny.full[:n_prompt]
    out = run_inprocess(tiny, strategy, tiny.aligned, prompt=prompt, n_predict=30,
                        transport=lambda stages: SteppedTransport(stages, lag=2))
    check_consistent(out, tiny.full[n_prompt:], 30)


@pytest.mark.parametrize("strategy", SPEC_STRATEGIES)
def test_stops_at_context_limit(tiny, strategy):
    n_ctx = len(tiny.prompt) + 13
    out = run_inprocess(tiny, strategy, tiny.aligned, n_ctx=n_ctx, n_predict=100,
                        spec=SpecOptions(draft_thread=False, p_accept=0.0, n_parallel=2, p_split=0.0,
                                         kv_size=4 * N_CTX),
                        transport=lambda stages: SteppedTransport(stages, lag=2))
    assert out.gen.stop_reason == "context"
    assert out.gen.tokens == list(tiny.reference[:13])
    assert out.pool.all_free


@pytest.mark.parametrize("strategy", SPEC_STRATEGIES)
def test_stops_cleanly_when_kv_cache_is_full(tiny, strategy):
    """Cells of rejected drafts are not reused: a small cache fills up, and generation stops
    early with a reason, its tokens still a prefix of the reference."""
    spec = SpecOptions(draft_thread=False, kv_size=len(tiny.prompt) + 40, p_accept=0.0, n_parallel=2,
                       p_split=0.0)
    # a slow pipeline (lag 6), so that pipeinfer completes its drafts
    out = run_inprocess(tiny, strategy, tiny.unrelated, spec=spec, n_predict=100,
                        transport=lambda stages: SteppedTransport(stages, lag=6))
    tokens = out.gen.tokens
    assert out.gen.stop_reason == "kv-cache"
    assert 0 < len(tokens) < 40 and tokens == list(tiny.reference[:len(tokens)])
    assert out.pool.all_free


@pytest.mark.parametrize("strategy", SPEC_STRATEGIES)
def test_stops_cleanly_when_kv_cache_is_full_single_branch(tiny, strategy):
    spec = SpecOptions(draft_thread=False, kv_size=len(tiny.prompt) + 40, p_accept=0.0)
    out = run_inprocess(tiny, strategy, tiny.unrelated, spec=spec, n_predict=100,
                        transport=lambda stages: SteppedTransport(stages, lag=2))
    tokens = out.gen.tokens
    assert out.gen.stop_reason == "kv-cache"
    assert 0 < len(tokens) < 40 and tokens == list(tiny.reference[:len(tokens)])
    assert out.pool.all_free


def test_local_transport_delay_lets_pipeinfer_speculate(tiny):
    out = run_inprocess(tiny, "pipeinfer", tiny.aligned,
                        transport=lambda stages: LocalTransport(stages, delay=2))
    check_consistent(out, tiny.reference)
    assert out.counters.runs_speculative > 0


# --- 2. property-based: scripted drafts and pipeline timing -----------------------------------


def _prop_settings(**kw):
    # SPEC_PROPERTY_EXAMPLES=500 for a longer bug hunt
    return settings(max_examples=int(os.environ.get("SPEC_PROPERTY_EXAMPLES", 25)), deadline=None, derandomize=False,
                    suppress_health_check=[HealthCheck.too_slow,
                                           HealthCheck.function_scoped_fixture], **kw)


@_prop_settings()
@given(strategy=st.sampled_from(SPEC_STRATEGIES),
       plans=st.lists(draft_plans, min_size=1, max_size=12),
       schedule=st.lists(st.sampled_from([0, 0, 1, 2, 3]), max_size=80),
       lag=st.sampled_from([0, 1, 2, 4, 8, 12]),
       abort=st.booleans(),
       head_layers=st.integers(0, 1),
       n_parallel=st.integers(1, 3),
       draft_max=st.integers(1, 4),
       max_runs=st.integers(2, 6),
       partitions=st.integers(1, 4),
       continuous=st.booleans(),
       cancel=st.booleans(),
       argmax=st.booleans())
def test_scheduler_property_exact(tiny, strategy, plans, schedule, lag, abort, head_layers,
                                  n_parallel, draft_max, max_runs, partitions, continuous,
                                  cancel, argmax):
    spec = SpecOptions(draft_thread=False, draft=draft_max, n_parallel=n_parallel, max_runs=max_runs,
                       partitions=partitions, continuous=continuous, cancel=cancel,
                       p_accept=0.0, p_recovery=0.0, p_decay=0.0)
    drafter = ScriptedDraft(tiny.full, tiny.n_vocab, plans)
    n_predict = 20
    out = run_inprocess(
        tiny, strategy, drafter, spec=spec, head_layers=head_layers, n_predict=n_predict,
        transport=lambda stages: SteppedTransport(stages, lag=lag, script=schedule, abort=abort,
                                                  argmax=argmax))
    check_consistent(out, tiny.reference, n_predict)
    c = out.counters
    for name, hit in (("drafted tokens accepted", c.n_accepted > 0),
                      ("runs cancelled as invalidated", c.runs_cancelled_invalidated > 0),
                      ("runs cancelled as superfluous", c.runs_cancelled_superfluous > 0),
                      ("stage decodes skipped", out.total("skipped") > 0),
                      ("stage decodes aborted", out.total("aborted") > 0)):
        event(f"{strategy}: {name}: {hit}")


@_prop_settings()
@given(strategy=st.sampled_from(SPEC_STRATEGIES),
       draft=st.sampled_from(DRAFTS),
       schedule=st.lists(st.integers(0, 3), max_size=60),
       lag=st.integers(0, 3),
       abort=st.booleans(),
       head_layers=st.integers(0, 1),
       n_parallel=st.integers(1, 3),
       draft_max=st.integers(1, 4),
       p_accept=st.sampled_from([0.0, 0.05, 0.3, 0.6]),
       p_split=st.sampled_from([0.0, 0.05, 0.3]),
       p_recovery=st.sampled_from([0.0, 0.05, 0.2]),
       p_decay=st.sampled_from([0.0, 0.01, 0.1]),
       max_runs=st.integers(2, 6),
       partitions=st.integers(1, 4),
       continuous=st.booleans(),
       cancel=st.booleans(),
       draft_thread=st.booleans())
def test_real_drafter_property_exact(tiny, strategy, draft, schedule, lag, abort, head_layers,
                                     n_parallel, draft_max, p_accept, p_split, p_recovery,
                                     p_decay, max_runs, partitions, continuous, cancel,
                                     draft_thread):
    """The real Drafter (confidence cutoff, branching, adaptive p_adjust) under random
    pipeline timing and options (pipeinfer: drafting on the head's thread or its own)."""
    spec = SpecOptions(draft=draft_max, p_accept=p_accept, p_split=p_split,
                       n_parallel=n_parallel, p_recovery=p_recovery, p_decay=p_decay,
                       continuous=continuous, cancel=cancel, max_runs=max_runs,
                       partitions=partitions, draft_thread=draft_thread)
    n_predict = 20
    out = run_inprocess(
        tiny, strategy, getattr(tiny, draft), spec=spec, head_layers=head_layers,
        n_predict=n_predict,
        transport=lambda stages: SteppedTransport(stages, lag=lag, script=schedule, abort=abort))
    check_consistent(out, tiny.reference, n_predict)


@pytest.mark.parametrize("lag", [2, 3, 5])   # slow enough for a micro-batch to be drafted
def test_counters_perfect_and_useless_drafts(tiny, lag):
    # (the guard off: useless drafts would pause speculation; tests/test_guard.py)
    spec = SpecOptions(draft_thread=False, p_accept=0.0, p_recovery=0.0, p_decay=0.0, guard=False)
    n = 40

    def go(strategy, plans):
        out = run_inprocess(tiny, strategy, ScriptedDraft(tiny.full, tiny.n_vocab, plans),
                            spec=spec, n_predict=n,
                            transport=lambda stages: SteppedTransport(stages, lag=lag))
        check_consistent(out, tiny.reference, n)
        return out.counters

    c = go("speculative", PERFECT)   # every drafted token verified: 5 tokens per run
    assert c.n_accepted == c.n_drafted == 4 * c.runs_speculative
    assert c.n_unverified == 0 and c.verified_accept_rate == c.accept_rate == 1
    assert c.runs_speculative == -(-(n - 1) // 5) and c.runs_started == c.runs_speculative + 1
    c = go("pipeinfer", PERFECT)     # every token after the first was a verified draft ...
    assert c.n_accepted == n - 1
    # ... and every verified one was accepted; only runs still in flight at the end, or cut
    # short by it, were not verified
    assert c.n_drafted - c.n_unverified - c.n_accepted <= spec.draft
    assert c.n_unverified <= spec.max_runs * spec.draft
    # ... so after the prefill and the first token's run, every run was speculative
    assert c.runs_started - c.runs_speculative == 2
    assert c.runs_cancelled_invalidated == c.runs_cancelled_superfluous == 0
    c = go("speculative", USELESS)
    assert c.n_accepted == 0 and c.n_drafted > 0 and c.runs_speculative == n - 1
    assert c.n_unverified == 0 and c.verified_accept_rate == c.accept_rate == 0
    c = go("pipeinfer", USELESS)
    assert c.n_accepted == 0 and c.n_drafted > 0
    # every speculative run was invalidated by the result before it (its first guess was
    # wrong) and dropped unverified: verification never saw a drafted token
    assert c.n_unverified == c.n_drafted and c.verified_accept_rate is None
    # every generated token after the first needed its own non-speculative run
    assert c.runs_started - c.runs_speculative == n
    assert c.runs_cancelled_invalidated > 0


# --- 3. run.py and partition_pool.py ----------------------------------------------------------

def _run(base: int, context: Sequence[int], branches, seqs=(1, 2, 3), speculative=True) -> Run:
    nodes, main = tree_from_branches(branches, list(seqs)[:len(branches)])
    return Run(0, base, tuple(context), nodes, speculative, main_path=main)


class TestClassify:
    ctx = (10, 11, 12)

    def test_valid_when_tree_continues_accepted(self):
        run = _run(3, self.ctx, [[20, 21, 22]])
        # pending token 20 at position 3: covered
        assert run.classify([10, 11, 12, 20]) == RunState.VALID
        assert run.classify([10, 11, 12, 20, 21]) == RunState.VALID
        assert run.classify([10, 11, 12, 20, 21, 22]) == RunState.VALID

    def test_valid_when_ahead_of_accepted(self):
        run = _run(5, self.ctx + (20, 21), [[22, 23]])
        assert run.classify([10, 11, 12, 20]) == RunState.VALID
        assert run.classify([10, 11, 12]) == RunState.VALID

    def test_invalidated_by_context(self):
        run = _run(5, self.ctx + (20, 21), [[22, 23]])
        assert run.classify([10, 11, 12, 99]) == RunState.INVALIDATED
        assert run.classify([10, 11, 13]) == RunState.INVALIDATED

    def test_invalidated_by_tree(self):
        run = _run(3, self.ctx, [[20, 21, 22], [20, 30]])
        assert run.classify([10, 11, 12, 20, 30]) == RunState.VALID   # second branch
        assert run.classify([10, 11, 12, 20, 31]) == RunState.INVALIDATED
        assert run.classify([10, 11, 12, 21]) == RunState.INVALIDATED

    def test_superfluous(self):
        run = _run(3, self.ctx, [[20, 21]])
        # positions 3, 4 accepted and the pending token sits at position 5: nothing to decide
        assert run.classify([10, 11, 12, 20, 21, 7]) == RunState.SUPERFLUOUS
        # its last node is the pending token: still valid (it gives the next token's logits)
        assert run.classify([10, 11, 12, 20, 21]) == RunState.VALID

    def test_superfluous_non_speculative(self):
        run = Run(0, 3, self.ctx, [Node(20, -1, 0, (0,))], speculative=False, main_path=[0])
        assert run.classify([10, 11, 12, 20]) == RunState.VALID
        assert run.classify([10, 11, 12, 20, 21]) == RunState.SUPERFLUOUS


class TestPathTo:
    def test_follows_accepted_tokens(self):
        run = _run(2, (1, 2), [[5, 6, 7], [5, 8], [9]])
        assert run.nodes[run.path_to([1, 2, 5])].token == 5
        node = run.path_to([1, 2, 5, 8])
        assert run.nodes[node].token == 8 and run.nodes[node].depth == 1
        node = run.path_to([1, 2, 5, 6, 7])
        assert run.nodes[node].token == 7 and run.nodes[node].depth == 2
        assert run.nodes[run.path_to([1, 2, 9])].token == 9

    def test_none_when_leaving_or_short(self):
        run = _run(2, (1, 2), [[5, 6, 7]])
        assert run.path_to([1, 2, 4]) is None
        assert run.path_to([1, 2, 5, 7]) is None
        assert run.path_to([1, 2]) is None
        assert run.path_to([1]) is None

    def test_accepted_beyond_tree(self):
        run = _run(2, (1, 2), [[5, 6]])
        assert run.path_to([1, 2, 5, 6, 9]) is None


branch_lists = st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=5), min_size=1,
                        max_size=4)


class TestTreeFromBranches:
    def test_example(self):
        nodes, main = tree_from_branches([[1, 2, 3], [1, 4], [5]], [7, 8, 9])
        assert [(n.token, n.parent, n.depth, n.seqs) for n in nodes] == [
            (1, -1, 0, (7, 8)), (5, -1, 0, (9,)), (2, 0, 1, (7,)), (4, 0, 1, (8,)),
            (3, 2, 2, (7,))]
        assert main == [0, 2, 4]

    def test_empty(self):
        assert tree_from_branches([], []) == ([], [])

    @given(branch_lists)
    def test_properties(self, branches):
        seqs = list(range(1, len(branches) + 1))
        nodes, main = tree_from_branches(branches, seqs)
        prefixes = {tuple(b[:d + 1]) for b in branches for d in range(len(b))}
        assert len(nodes) == len(prefixes)
        for i, node in enumerate(nodes):
            if node.parent == -1:
                assert node.depth == 0
            else:
                assert node.parent < i                       # parents first
                parent = nodes[node.parent]
                assert node.depth == parent.depth + 1
                assert set(node.seqs) <= set(parent.seqs)    # sequence sets nest
        assert [n.depth for n in nodes] == sorted(n.depth for n in nodes)
        # branch 0 is the main path, and every branch is a root-to-node path with its seq
        assert [nodes[i].token for i in main] == list(branches[0])
        for b, branch in enumerate(branches):
            node, path = -1, []
            for token in branch:
                node = next(i for i, n in enumerate(nodes)
                            if n.parent == node and n.token == token)
                path.append(node)
                assert seqs[b] in nodes[node].seqs
            if b == 0:
                assert path == main
        # a node's seqs are exactly the branches through it
        for node in nodes:
            for s in node.seqs:
                assert s in seqs

    @given(branch_lists)
    def test_run_views(self, branches):
        nodes, main = tree_from_branches(branches, list(range(1, len(branches) + 1)))
        run = Run(3, 4, (0, 1, 2, 3), nodes, True, main_path=main)
        assert run.max_pos == 4 + max(len(b) for b in branches) - 1
        tx = run.tx()
        assert tx.positions == tuple(4 + n.depth for n in nodes)
        assert tx.seq_ids == tuple(n.seqs for n in nodes)
        assert all(tx.logit_rows) and tx.speculative
        for branch in branches:
            node = run.path_to([0, 1, 2, 3] + list(branch))
            assert node is not None and run.nodes[node].depth == len(branch) - 1


class TestPartitionPool:
    def test_fifo_order(self):
        pool = PartitionPool(3, 2)
        a, b, c = pool.take(), pool.take(), pool.take()
        assert (a, b, c) == ((1, 2), (3, 4), (5, 6))
        assert pool.take() is None and pool.n_free == 0
        pool.give_back(b)
        pool.give_back(a)
        assert pool.take() == b          # oldest returned first
        pool.give_back(c)
        assert pool.take() == a
        assert pool.take() == c

    def test_sequence_ids(self):
        pool = PartitionPool(4, 3)
        assert pool.graveyard == 13 and pool.n_seq == 14
        ids = [s for _ in range(4) for s in pool.take()]
        assert ids == list(range(1, 13))

    def test_double_return(self):
        pool = PartitionPool(2, 1)
        p = pool.take()
        pool.give_back(p)
        with pytest.raises(RuntimeError, match="twice"):
            pool.give_back(p)
        with pytest.raises(RuntimeError, match="twice"):
            pool.give_back(pool._free[0])

    def test_all_free(self):
        pool = PartitionPool(2, 1)
        assert pool.all_free
        p = pool.take()
        assert not pool.all_free
        pool.give_back(p)
        assert pool.all_free

    @pytest.mark.parametrize("n,w", [(0, 1), (1, 0)])
    def test_invalid(self, n, w):
        with pytest.raises(ValueError):
            PartitionPool(n, w)

    @given(st.lists(st.booleans(), max_size=60), st.integers(1, 5))
    def test_fifo_model(self, ops, n):
        pool = PartitionPool(n, 1)
        free = deque((i,) for i in range(1, n + 1))
        held: deque = deque()
        for take in ops:
            if take:
                got = pool.take()
                assert got == (free.popleft() if free else None)
                if got is not None:
                    held.append(got)
            elif held:
                p = held.popleft()
                pool.give_back(p)
                free.append(p)
            assert pool.n_free == len(free)
