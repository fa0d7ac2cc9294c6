"""The `specpipe` strategy (SpecPipe / PipeDec: one tree level per pipeline step, fixed-width
tree, reroot on a hit, flush and refill on a miss).

In process (LocalTransport with delays, SteppedTransport with lags, the head with and without
target layers) and through real `mpiexec`: greedy output equals single-node greedy decoding
token for token, for aligned and unrelated drafts; afterwards no beam-slot sequence holds a
KV entry on any stage, and sequence 0 holds accepted tokens only.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support import mpi_util
from pipeinfer.engine.drafting.drafter import Drafter
from pipeinfer.engine.head.pipeline import Pipeline
from pipeinfer.model.sampling import SamplingParams
from pipeinfer.model.stage import Stage, StageConfig
from pipeinfer.schedule.options import SpecOptions
from pipeinfer.schedule.specpipe_tree import BeamTree
from pipeinfer.schedule.transaction import DecodeTx
from pipeinfer.engine.worker.local import LocalTransport
from support.rig import Rig
from support.stepped_transport import SteppedTransport
from support.tiny_set import N_BATCH, N_PREDICT, PROMPT, greedy_reference

DRAFTS = ("aligned", "unrelated")


def run_specpipe(tiny, draft: str, *, width=4, k=2, head_layers=1, n_workers=2,
                 transport=None, n_predict=N_PREDICT, reference=None, stop="length",
                 run_kw=None, iterative_too=False, speculates=True, **kw):
    """One specpipe generation on fresh stages; checks the tokens (a prefix of `reference`,
    default the greedy one, False: unchecked; all n_predict of them when stopped by
    length), the counters, and the KV state after. With `iterative_too`, also returns the iterative strategy's outcome
    on the same stages (with the same run_kw)."""
    spec = SpecOptions(tree_width=width, tree_k=k, partitions=max(8, width), **kw)
    check = reference is not False   # False: sampled output, not checked here
    reference = list(tiny.reference if reference is None else reference or ())
    run_kw = run_kw or {}
    with Rig(tiny, None, spec=spec, head_layers=head_layers, n_workers=n_workers) as rig:
        dstage = Stage(getattr(tiny, draft), StageConfig(n_ctx=rig.cfg.kv_size, n_batch=N_BATCH,
                                                         n_seq_max=width + 1),
                       final=True, label="draft")
        try:
            out = rig.run("specpipe", draft=Drafter(dstage, N_BATCH), transport=transport,
                          n_predict=n_predict, **run_kw)
            stages = ([rig.head] if rig.head else []) + rig.workers
            c = out.counters
            tokens = out.gen.tokens
            assert out.gen.stop_reason == stop
            assert not check or tokens == reference[:len(tokens)]
            if stop == "length":
                assert len(tokens) == n_predict
            assert out.pool.all_free
            n_prompt = len(out.gen.request.prompt)
            assert all(m <= n_prompt + len(tokens) - 2 for m in out.seq0_max), out.seq0_max
            slots = range(1, width + 1)
            for stage in stages:   # no stray entries in any beam slot
                assert [stage.seq_pos_max(s) for s in slots] == [-1] * width, stage.label
            assert [dstage.seq_pos_max(s) for s in slots] == [-1] * width
            for s in out.stats:
                assert s["computed"] + s["skipped"] + s["aborted"] == c.runs_started, (s, c)
            assert c.tree_steps == len(tokens) - 1        # one verification per token
            assert c.tree_hits + c.flushes <= c.tree_steps
            assert 0 <= c.n_accepted == c.tree_hits <= c.n_drafted
            assert c.runs_speculative > 0 or len(tokens) <= 2 or not speculates
            if check and stop == "length" and len(reference) > len(tokens):
                _continue_from_seq0(rig, out, reference[len(tokens)])
            if iterative_too:
                return out, rig.run("iterative", n_predict=n_predict, **run_kw)
            return out
        finally:
            dstage.close()


def _continue_from_seq0(rig, out, expected: int) -> None:
    """Sequence 0 holds accepted tokens only, the same on every stage: evaluating the rest
    of the accepted tokens on top of it gives the target's greedy next token."""
    assert len(set(out.seq0_max)) == 1, out.seq0_max
    full = list(out.gen.request.prompt) + out.gen.tokens
    pos = list(range(out.seq0_max[0] + 1, len(full)))
    pipe = Pipeline(rig.embed, rig.head, LocalTransport(rig.workers))
    pipe.decode(DecodeTx(10**6, tuple(pos), ((0,),) * len(pos),
                         tuple(i == len(pos) - 1 for i in range(len(pos)))),
                [full[p] for p in pos])
    result = pipe.wait()
    assert int(np.argmax(result.logits[-1])) == expected


@pytest.mark.slow
@pytest.mark.parametrize("draft", DRAFTS)
@pytest.mark.parametrize("delay", [0, 1, 3])
def test_local_transport_exact(tiny, draft, delay):
    out = run_specpipe(tiny, draft,
                       transport=lambda stages: LocalTransport(stages, delay=delay))
    if draft == "unrelated":
        assert out.counters.flushes > 0


@pytest.mark.slow
@pytest.mark.parametrize("draft", DRAFTS)
@pytest.mark.parametrize("head_layers", [0, 1])
@pytest.mark.parametrize("lag", [0, 2])
@pytest.mark.parametrize("abort", [False, True], ids=["skip", "abort"])
def test_stepped_pipeline_exact(tiny, draft, head_layers, lag, abort):
    out = run_specpipe(tiny, draft, head_layers=head_layers,
                       transport=lambda stages: SteppedTransport(stages, lag=lag, abort=abort,
                                                                 argmax=abort))
    c = out.counters
    if draft == "unrelated":
        assert c.flushes > 0 and c.runs_cancelled_invalidated > 0
    else:
        assert c.tree_hits > 0


@pytest.mark.slow
@pytest.mark.parametrize("width,k", [(1, 1), (2, 3), (6, 2)])
def test_tree_shapes_exact(tiny, width, k):
    for draft in DRAFTS:
        run_specpipe(tiny, draft, width=width, k=k, n_workers=3,
                     transport=lambda stages: SteppedTransport(stages, lag=1, abort=True))


def test_no_cancel_exact(tiny):
    out = run_specpipe(tiny, "unrelated", cancel=False,
                       transport=lambda stages: SteppedTransport(stages, lag=1))
    assert out.total("skipped") == out.total("aborted") == 0


def test_long_generation_exact(tiny):
    out = run_specpipe(tiny, "aligned", n_predict=120,
                       transport=lambda stages: SteppedTransport(stages, lag=1))
    assert out.counters.mean_tree_size > 1


@pytest.mark.parametrize("n_predict", [1, 2, 3])
def test_few_tokens(tiny, n_predict):
    run_specpipe(tiny, "aligned", n_predict=n_predict,
                 transport=lambda stages: SteppedTransport(stages, lag=1))


def test_prompt_longer_than_batch(tiny):
    n_prompt = N_BATCH + 20
    run_specpipe(tiny, "aligned", n_predict=30, reference=tiny.full[n_prompt:],
                 run_kw={"prompt": tiny.full[:n_prompt]},
                 transport=lambda stages: SteppedTransport(stages, lag=2))


def test_stops_at_context_limit(tiny):
    n_ctx = len(tiny.prompt) + 13
    out = run_specpipe(tiny, "aligned", n_predict=100, stop="context",
                       run_kw={"n_ctx": n_ctx},
                       transport=lambda stages: SteppedTransport(stages, lag=2))
    assert len(out.gen.tokens) == 13


def test_stops_cleanly_when_kv_cache_is_full(tiny):
    """A cache too small for the whole generation: speculation stops while the cells left
    still allow one per token, then generation stops with a reason."""
    kv_size = len(tiny.prompt) + 40
    out = run_specpipe(tiny, "unrelated", n_predict=100, stop="kv-cache", kv_size=kv_size,
                       speculates=False,
                       transport=lambda stages: SteppedTransport(stages, lag=2))
    assert 0 < len(out.gen.tokens) <= 40


@pytest.mark.parametrize("draft", DRAFTS)
def test_tight_kv_cache_still_finishes(tiny, draft):
    """Room for the generation plus a little: speculation gives way, the output is whole."""
    n = 60
    run_specpipe(tiny, draft, n_predict=n, kv_size=len(tiny.prompt) + n + 20,
                 transport=lambda stages: SteppedTransport(stages, lag=1))


@pytest.mark.parametrize("draft", DRAFTS)
def test_end_of_generation_stops_exactly(tiny, draft):
    k = next(i for i in range(6, len(tiny.reference)) if tiny.reference[i] not in
             tiny.reference[:i])
    eog = tiny.reference[k]
    out = run_specpipe(tiny, draft, stop="eos", run_kw={"eog": lambda t: t == eog},
                       transport=lambda stages: SteppedTransport(stages, lag=2))
    assert out.gen.tokens == list(tiny.reference[:k + 1])


@pytest.mark.parametrize("draft", DRAFTS)
def test_sampling_is_lossless(tiny, draft):
    """With --temp > 0 the target draws one sample per position, in order: the same seed
    gives the same text as the iterative strategy."""
    sampling = SamplingParams(temp=0.8, top_k=40, top_p=0.95, seed=7)
    out, it = run_specpipe(tiny, draft, n_predict=24, reference=False,
                           run_kw={"sampling": sampling}, iterative_too=True,
                           transport=lambda stages: SteppedTransport(stages, lag=1))
    assert out.gen.tokens == it.gen.tokens
    assert out.gen.tokens != list(tiny.reference[:24])   # it did sample


@settings(max_examples=int(os.environ.get("SPEC_PROPERTY_EXAMPLES", 15)), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(draft=st.sampled_from(DRAFTS),
       schedule=st.lists(st.sampled_from([0, 0, 1, 2, 3]), max_size=80),
       lag=st.sampled_from([0, 1, 2, 4, 8]),
       abort=st.booleans(), head_layers=st.integers(0, 1), n_workers=st.integers(1, 3),
       width=st.integers(1, 5), k=st.integers(1, 3), max_runs=st.integers(2, 6),
       cancel=st.booleans())
def test_property_exact(tiny, draft, schedule, lag, abort, head_layers, n_workers, width, k,
                        max_runs, cancel):
    """Random pipeline timing (a scripted order of stage steps), tree shapes and options."""
    run_specpipe(tiny, draft, width=width, k=k, head_layers=head_layers, n_workers=n_workers,
                 n_predict=20, max_runs=max_runs, cancel=cancel,
                 transport=lambda stages: SteppedTransport(stages, lag=lag, script=schedule,
                                                           abort=abort, argmax=abort))


# --- the tree itself ---------------------------------------------------------------------------

def _logits(n_vocab: int, best: list[int]) -> np.ndarray:
    z = np.zeros(n_vocab, dtype=np.float32)
    for rank, t in enumerate(best):
        z[t] = 10.0 - rank
    return z


def test_tree_fixed_width_and_slots():
    tree = BeamTree(width=3, k=2)
    root = tree.reset(5, 10)
    level1 = tree.choose({root: _logits(20, [1, 2])})
    assert [(c.token, c.slot, c.copy) for c in level1] == [(1, 0, False), (2, 1, True)]
    ids = tree.grow(level1)
    assert tree.bottom == {0: ids[0], 1: ids[1]} and tree.bottom_pos() == 11
    # both children of node 1 beat node 2's: node 2's beam dies, its slot is reused
    lg = {ids[0]: _logits(20, [3, 4]), ids[1]: np.zeros(20, dtype=np.float32)}
    level2 = tree.choose(lg)
    assert len(level2) == 3
    assert [c.parent for c in level2[:2]] == [ids[0], ids[0]]
    assert level2[0].slot == 0 and not level2[0].copy and level2[1].copy
    ids2 = tree.grow(level2)
    assert tree.holder(ids[1]) == 1 or tree.holder(ids[1]) is None
    freed = tree.reroot(ids[0])
    assert tree.accepted == ids[0] and set(tree.nodes) == {ids[0], ids2[0], ids2[1]}
    assert all(tree.descends(b, ids[0]) for b in tree.bottom.values())
    assert set(freed) | set(tree.bottom) == {0, 1, 2}


# --- real MPI ranks --------------------------------------------------------------------------

N_MPI = 40


@pytest.fixture(scope="module")
def reference(tiny):
    return greedy_reference(tiny.target, tiny.prompt, N_MPI)


@pytest.mark.slow
@pytest.mark.parametrize("draft", DRAFTS)
@pytest.mark.parametrize("split", ["1", "0,1", "0.5,0.5", "0,0.5,0.5",
                                   "0.25,0.25,0.25,0.25"])
def test_mpi_exact(tiny, reference, draft, split):
    n = len(split.split(","))
    launch = mpi_util.run_pipeinfer(
        n, tiny.target, PROMPT, "--ignore-eos", "--strategy", "specpipe", "-md",
        str(getattr(tiny, draft)), "--layer-split", split, "--tree-width", "3", "--tree-k", "2",
        n_predict=N_MPI, timeout=180)
    assert launch.rc == 0 and not launch.timed_out, launch.describe()
    r = launch.json
    assert r is not None and "Traceback" not in launch.stderr, launch.describe()
    assert r["tokens"] == reference
    assert r["stop_reason"] == "length" and r["partitions_free"] is True
    assert r["hit_rate"] is not None and r["mean_tree_size"] is not None
    workers = [s for s in r["rank_stats"] if s["rank"] > 0]
    assert len(workers) == n - 1
    for s in workers:
        assert s["computed"] + s["skipped"] + s["aborted"] == r["runs_started"], s
    if draft == "unrelated":
        assert r["flushes"] > 0



def test_mpi_csv_and_summary(tiny, reference, tmp_path):
    """The CSV row and the stderr summary carry the tree's hit rate, flushes and size."""
    import csv
    path = tmp_path / "r.csv"
    launch = mpi_util.run_pipeinfer(
        2, tiny.target, PROMPT, "--ignore-eos", "--strategy", "specpipe", "-md",
        str(tiny.unrelated), "--layer-split", "0.5,0.5", "--csv", str(path),
        n_predict=N_MPI, as_json=False, timeout=180)
    assert launch.rc == 0 and not launch.timed_out, launch.describe()
    assert "tree hit rate" in launch.stderr and "flush(es)" in launch.stderr
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 1 and rows[0]["strategy"] == "specpipe"
    assert int(rows[0]["flushes"]) > 0
    assert 0 <= float(rows[0]["hit_rate"]) <= 1 and float(rows[0]["mean_tree_size"]) > 0
