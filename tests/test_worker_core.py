"""The per-rank rules (engine/worker_core.StageCore) on real llama.cpp stages: a run cancelled
before it starts is skipped without touching the stage, one cancelled while it computes is
aborted from another thread and leaves the cache as before, cancellations of finished runs
are ignored, KV operations apply in order, and every decode is counted and leaves a span.
LocalTransport's stages and the tests' SteppedTransport (tests/support/stepped_transport.py)
go through the same core."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from support import tinymodel
from pipeinfer.engine.worker.core import StageCore
from pipeinfer.model.partition import partition
from pipeinfer.model.slicing import split_model
from pipeinfer.model.stage import Stage, StageAborted, StageConfig
from pipeinfer.engine.transport.wire import (decode_header, decode_kv_ops, decode_tx,
                                             encode_kv_ops, encode_meta)
from pipeinfer.schedule.transaction import DecodeTx, seq_compact, seq_cp, seq_keep, seq_rm
from pipeinfer.engine.worker.local import LocalTransport
from support.stepped_transport import SteppedTransport

CFG = StageConfig(n_ctx=512, n_batch=256, n_seq_max=4, n_threads=1)
N_EMBD, N_PREFIX, N_BIG = 512, 8, 256
STATS_KEYS = {"computed", "skipped", "aborted", "busy_s", "kv_ops"}


@pytest.fixture(scope="module")
def final_stage_file(tmp_path_factory) -> Path:
    """The last half of a tiny llama wide enough that a 256-token decode takes long (about a
    hundred graph nodes) for a cancellation to land inside it; activations in, logits out,
    as the last worker rank's stage."""
    d = tmp_path_factory.mktemp("core")
    model = tinymodel.write_tiny_llama(d / "wide.gguf", n_layer=6, n_embd=N_EMBD, n_head=8,
                                       n_head_kv=4, n_ff=2048)
    manifest = json.loads(split_model(model, partition(6, [0.0, 0.5, 0.5]), d).read_text())
    return d / manifest["stages"][2]["file"]


X = np.random.default_rng(3).standard_normal((N_PREFIX + N_BIG, N_EMBD)).astype(np.float32)


def tx(run_id: int, p0: int, n: int, seq: int = 0, speculative: bool = False) -> DecodeTx:
    return DecodeTx(run_id, tuple(range(p0, p0 + n)), ((seq,),) * n, (True,) * n, speculative)


PREFIX, BIG = tx(1, 0, N_PREFIX), tx(2, N_PREFIX, N_BIG, speculative=True)


def x_of(t: DecodeTx) -> np.ndarray:
    return X[t.positions[0]:t.positions[-1] + 1]


def decode(core: StageCore, t: DecodeTx):
    return core.decode(t, x_of(t))


@pytest.fixture(scope="module")
def want(final_stage_file) -> np.ndarray:
    """BIG's logits on a fresh stage after the prefix."""
    with Stage(final_stage_file, CFG) as stage:
        stage.decode(PREFIX.positions, PREFIX.seq_ids, embd=x_of(PREFIX), run_id=1)
        return stage.decode(BIG.positions, BIG.seq_ids, embd=x_of(BIG), run_id=2)


@pytest.fixture
def stage(final_stage_file):
    with Stage(final_stage_file, CFG) as s:
        yield s


def check_spans(core: StageCore, expected: list[tuple[int, str, int, bool]]) -> None:
    spans = list(core.spans)
    assert [(r, outcome, n, spec) for r, _, _, outcome, n, spec in spans] == expected
    for _, start, end, outcome, _, _ in spans:
        assert (start == end) == (outcome == "skipped") and start <= end
    assert all(a[1] <= b[1] for a, b in zip(spans, spans[1:]))
    counts = {k: sum(1 for s in spans if s[3] == k) for k in ("computed", "skipped", "aborted")}
    assert {k: core.stats[k] for k in counts} == counts
    busy = sum(end - start for _, start, end, _, _, _ in spans)
    assert core.stats["busy_s"] == pytest.approx(busy, abs=0.05)
    report = core.report()
    assert set(report) == STATS_KEYS | {"spans"} and report["spans"] == spans


def test_cancel_before_start_skips_without_touching_the_stage(stage, want):
    core = StageCore(stage)
    out, outcome = decode(core, PREFIX)
    assert outcome == "computed" and out.shape == (N_PREFIX, stage.n_vocab)
    core.cancel([2])
    assert core.pending == {2}
    polls = stage.abort_polls
    assert decode(core, BIG) == (None, "skipped")
    assert stage.abort_polls == polls          # llama.cpp never ran a graph node
    assert stage.seq_pos_max(0) == N_PREFIX - 1
    assert core.pending == frozenset()

    # skipped upstream (no activations came): skipped here, whatever was cancelled
    third = tx(3, N_PREFIX, N_BIG)
    assert core.decode(third, None) == (None, "skipped")
    assert stage.abort_polls == polls and stage.seq_pos_max(0) == N_PREFIX - 1

    out, outcome = decode(core, tx(4, N_PREFIX, N_BIG))  # the stage was left as it was
    assert outcome == "computed" and np.array_equal(out, want)
    check_spans(core, [(1, "computed", N_PREFIX, False), (2, "skipped", N_BIG, True),
                       (3, "skipped", N_BIG, False), (4, "computed", N_BIG, False)])


def _wait_for_graph(stage: Stage, computing: threading.Event, polls_before: int) -> None:
    """Block until the decode is inside llama.cpp's graph (a few nodes done)."""
    assert computing.wait(timeout=30), "decode never started"
    deadline = time.monotonic() + 30
    while stage.abort_polls < polls_before + 3:
        assert time.monotonic() < deadline, "decode never reached the graph"
        time.sleep(0.0005)


def test_cancel_during_decode_aborts_it(stage, want):
    computing = threading.Event()
    core = StageCore(stage, computing=computing)
    decode(core, PREFIX)
    result: dict = {}
    worker = threading.Thread(target=lambda: result.update(got=decode(core, BIG)), daemon=True)
    polls = stage.abort_polls
    worker.start()
    _wait_for_graph(stage, computing, polls)
    core.cancel([2])            # as the MPI worker's cancel watcher does
    worker.join(timeout=60)
    assert not worker.is_alive()
    assert result["got"] == (None, "aborted")
    assert not computing.is_set()
    assert stage.seq_pos_max(0) == N_PREFIX - 1   # the cache is as before the decode
    assert core.pending == frozenset()

    out, outcome = decode(core, tx(3, N_PREFIX, N_BIG, speculative=True))
    assert outcome == "computed" and np.array_equal(out, want)
    check_spans(core, [(1, "computed", N_PREFIX, False), (2, "aborted", N_BIG, True),
                       (3, "computed", N_BIG, True)])
    assert core.stats["aborted"] == 1


def test_cancel_of_finished_runs_is_ignored(stage, want):
    armed: list[int] = []

    class Spy:  # the stage, with its aborts recorded
        def __getattr__(self, name):
            return getattr(stage, name)

        def cancel(self, run_id):
            armed.append(run_id)
            stage.cancel(run_id)

    core = StageCore(Spy())
    decode(core, PREFIX)
    core.cancel([0, 1])
    assert core.pending == frozenset() and armed == []
    core.cancel(np.array([1, 5], dtype=np.int64))  # ids as the cancel channel delivers them
    assert core.pending == {5} and armed == []
    out, outcome = decode(core, BIG)
    assert outcome == "computed" and np.array_equal(out, want)
    core.cancel([2])
    assert core.pending == {5} and armed == []
    check_spans(core, [(1, "computed", N_PREFIX, False), (2, "computed", N_BIG, True)])


def test_kv_ops_apply_in_order(stage):
    core = StageCore(stage)
    decode(core, PREFIX)
    # copy, then trim the source: seq 1 keeps the whole prefix
    core.kv([seq_cp(0, 1), seq_rm(0, 4, -1)])
    assert (stage.seq_pos_max(0), stage.seq_pos_max(1)) == (3, N_PREFIX - 1)
    # trim, then copy: seq 2 gets only what is left
    core.kv([seq_rm(1, 6, -1), seq_cp(1, 2), seq_keep(2)])
    assert [stage.seq_pos_max(s) for s in range(3)] == [-1, -1, 5]
    assert core.stats["kv_ops"] == 5
    out, outcome = decode(core, tx(2, 6, 2, seq=2))  # seq 2 continues where its copy ends
    assert outcome == "computed" and stage.seq_pos_max(2) == 7
    check_spans(core, [(1, "computed", N_PREFIX, False), (2, "computed", 2, False)])
    # compaction (a serving slot's kept cells) moves cells, it keeps what the sequence holds
    core.kv([seq_compact(2)])
    assert [stage.seq_pos_max(s) for s in range(3)] == [-1, -1, 7]
    assert decode_kv_ops(encode_kv_ops([seq_compact(2)])) == [seq_compact(2)]


class StandIn:
    """A stage stand-in for LocalTransport: `aborts` raise StageAborted."""

    def __init__(self, aborts=()):
        self.aborts = set(aborts)

    def decode(self, positions, seq_ids, *, embd=None, logit_rows=None, run_id=-1, slot=0):
        if run_id in self.aborts:
            raise StageAborted()
        return np.zeros((len(positions), 4), dtype=np.float32)


def test_local_transport_stages_follow_the_core():
    """A run aborted on a middle stage is skipped downstream, as between MPI workers."""
    transport = LocalTransport([StandIn(), StandIn(aborts={1}), StandIn()], delay=0)
    transport.send_decode(tx(0, 0, 2), None)
    transport.send_decode(tx(1, 2, 1), None)
    transport.send_cancel([0, 2])      # run 0 is done: ignored; run 2 not sent yet
    transport.send_decode(tx(2, 2, 1), None)
    results = [transport.poll_result() for _ in range(3)]
    assert [(r.run_id, r.cancelled) for r in results] == [(0, False), (1, True), (2, True)]
    stats = transport.shutdown()
    outcomes = [[span[3] for span in s["spans"]] for s in stats]
    assert outcomes == [["computed", "computed", "skipped"], ["computed", "aborted", "skipped"],
                        ["computed", "skipped", "skipped"]]
    assert [s["rank"] for s in stats] == [1, 2, 3]
    assert all(set(s) == STATS_KEYS | {"rank", "spans"} for s in stats)


class Cancellable(StandIn):
    """A stand-in whose cancel() aborts the run's decode, as Stage.cancel does."""

    def cancel(self, run_id):
        self.aborts.add(run_id)


def test_stepped_transport_stages_follow_the_core():
    """The tests' stepped pipeline: a cancellation of the run a stage is computing aborts it
    there (through the core: Stage.cancel while the run is active), a run not started yet is
    skipped, a run done is not touched; downstream stages skip what was aborted upstream."""
    stages = [Cancellable(), Cancellable()]
    transport = SteppedTransport(stages, script=[1, 1, 2, 0], abort=True)
    x = np.zeros((1, 4), dtype=np.float32)
    for run_id in range(3):
        transport.send_decode(tx(run_id, run_id, 1), x)
    assert transport.poll_result() is None             # stage 1 computed run 0
    assert transport.poll_result() is None             # ... and run 1
    assert transport.poll_result().run_id == 0         # stage 2 computed run 0
    # stage 2 computes run 1 now, stage 1 run 2; run 0 is done everywhere, run 3 not sent
    transport.send_cancel([0, 1, 3])
    transport.send_decode(tx(3, 3, 1), x)
    assert transport.poll_result() is None             # (script: nothing moves)
    results = [transport.poll_result() for _ in range(4)]   # ticks, the script exhausted
    assert [(r.run_id, r.cancelled) for r in results if r] == [(1, True), (2, False), (3, True)]
    outcomes = [[span[3] for span in s["spans"]] for s in transport.shutdown()]
    assert outcomes == [["computed", "computed", "computed", "skipped"],
                        ["computed", "aborted", "computed", "skipped"]]
    assert stages[1].aborts == {1} and stages[0].aborts == set()


def test_the_slot_travels_with_decodes_and_kv_ops():
    """A run's slot (the stage context it decodes in: serve --parallel) and every KV
    operation's slot survive the wire encoding."""
    run = DecodeTx(7, (3, 4), ((0,), (1, 2)), (False, True), speculative=True, slot=3)
    meta = encode_meta(run)
    assert decode_tx(decode_header(run, meta_len=len(meta)), meta) == run
    ops = [replace(seq_cp(1, 0, 2, 5), slot=2), seq_rm(4), replace(seq_rm(-1), slot=1)]
    assert decode_kv_ops(encode_kv_ops(ops)) == ops
    assert repr(ops[0]) == "cp(1->0, [2,5))@2" and repr(ops[1]) == "rm(4, [-1,-1))"
