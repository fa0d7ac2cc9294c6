"""What the head's trace gets from other ranks (issue 18 item 6): each rank's clock offset
(clock_sync.clock_offsets, under a real `mpiexec -n 3`) and the stage spans a worker sends with its
statistics (a real Worker under `mpiexec -n 2`; LocalTransport's in-process stages).

Ranks on one host share the monotonic clock, so the true offset is 0; a rank whose clock the
test script shifts (pipeinfer.engine.transport.clock_sync.mpi_now patched on rank 2) must come out
shifted by that much.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from support.mpi_util import PYTHON, launch, mpi_command
from pipeinfer.model.stage import StageAborted
from pipeinfer.schedule.transaction import DecodeTx
from pipeinfer.engine.worker.local import LocalTransport

TOLERANCE_S = 5e-3
TIMEOUT = 120.0

SCRIPT = """
import json, pathlib, sys
from pipeinfer.engine.transport import clock_sync
from pipeinfer.engine.transport.mpi import Link

skew, out_dir = float(sys.argv[1]), pathlib.Path(sys.argv[2])
link = Link()
if link.rank == 2 and skew:
    real = clock_sync.mpi_now
    clock_sync.mpi_now = lambda: real() + skew
offsets = clock_sync.clock_offsets(link)
result = None if offsets is None else {str(k): v for k, v in offsets.items()}
# a file per rank: the launcher may splice lines that ranks print at the same time
(out_dir / f"rank{link.rank}.json").write_text(json.dumps(result))
link.barrier()
"""


def run_clock(tmp_path, skew: float) -> dict[int, dict | None]:
    script = tmp_path / "clock.py"
    script.write_text(SCRIPT)
    result = launch(mpi_command(3, [PYTHON, script, str(skew), tmp_path]), timeout=TIMEOUT)
    assert result.rc == 0 and not result.timed_out, result.describe()
    return {rank: json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(3)}


@pytest.mark.parametrize("skew", [0.0, 100.0])
def test_clock_offsets(tmp_path, skew):
    out = run_clock(tmp_path, skew)
    assert out[1] is None and out[2] is None  # only the head gets the offsets
    offsets = out[0]
    assert sorted(offsets) == ["1", "2"]
    assert abs(offsets["1"]) < TOLERANCE_S, offsets
    assert abs(offsets["2"] - skew) < TOLERANCE_S, offsets


# Rank 0 sends three decodes to a real Worker on rank 1 whose stage is a stand-in: run 0 is
# computed, run 1 arrives marked skipped (as if an earlier rank had skipped it), run 2's decode
# is aborted. The head writes the worker's spans, its clock offset and its own time window.
WORKER_SCRIPT = """
import json, pathlib, sys, time
import numpy as np
from pipeinfer.engine.transport.clock_sync import clock_offsets
from pipeinfer.engine.transport.head_transport import HeadTransport
from pipeinfer.engine.transport.mpi import world
from pipeinfer.engine.transport.worker_link import WorkerLink
from pipeinfer.model.stage import StageAborted
from pipeinfer.engine.transport.wire import Tag, decode_header, encode_meta
from pipeinfer.schedule.transaction import DecodeTx
from pipeinfer.engine.worker.loop import Worker

N_VOCAB = 4

class FakeStage:
    has_refill_contexts = False

    def decode(self, positions, seq_ids, *, embd=None, logit_rows=None, run_id=-1, slot=0):
        time.sleep(0.01)
        if run_id == 2:
            raise StageAborted()
        return np.zeros((sum(logit_rows), N_VOCAB), dtype=np.float32)

    def cancel(self, run_id):
        pass

def tx(run, n, speculative):
    return DecodeTx(run, tuple(range(n)), ((0,),) * n, (True,) * n, speculative)

def collect(link, n):  # the first n results, as (run id, cancelled)
    results = []
    while len(results) < n:
        result = link.poll_result()
        if result is None:
            time.sleep(0.001)
        else:
            results.append((result.run_id, result.cancelled))
    return results

out = pathlib.Path(sys.argv[1])
if world()[0] == 0:
    link = HeadTransport(N_VOCAB)
    offsets = clock_offsets(link)
    t_first = time.monotonic()
    link.send_decode(tx(0, 2, False), np.zeros((2, 8), dtype=np.float32))
    skipped = tx(1, 1, True)
    meta = encode_meta(skipped)
    link.isend(decode_header(skipped, skipped=True, meta_len=len(meta)), 1, Tag.BEGIN)
    link.isend(meta, 1, Tag.DECODE_META)
    link.send_decode(tx(2, 3, True), np.zeros((3, 8), dtype=np.float32))
    results = collect(link, 3)
    t_last = time.monotonic()
    stats = link.shutdown()
    out.write_text(json.dumps({"offset": offsets[1], "window": [t_first, t_last],
                               "results": results, "spans": stats[0]["spans"]}))
else:
    link = WorkerLink()
    clock_offsets(link)
    Worker(link, FakeStage()).run()
"""


def run_script(tmp_path, text: str, n_ranks: int) -> dict:
    """Run a script of this file under mpiexec; what its head wrote."""
    script, out = tmp_path / "script.py", tmp_path / "out.json"
    script.write_text(text)
    result = launch(mpi_command(n_ranks, [PYTHON, script, out]), timeout=TIMEOUT)
    assert result.rc == 0 and not result.timed_out, result.describe()
    return json.loads(out.read_text())


def test_worker_spans_reach_the_head(tmp_path):
    got = run_script(tmp_path, WORKER_SCRIPT, 2)
    assert got["results"] == [[0, False], [1, True], [2, True]]
    spans = got["spans"]
    assert [[run, outcome, n, spec] for run, _, _, outcome, n, spec in spans] == [
        [0, "computed", 2, False], [1, "skipped", 1, True], [2, "aborted", 3, True]]
    first, last = got["window"]
    for run, start, end, outcome, _, _ in spans:
        start, end = start - got["offset"], end - got["offset"]  # into the head's clock
        assert first - TOLERANCE_S <= start <= end <= last + TOLERANCE_S, (spans, got)
        assert (end == start) == (outcome == "skipped")
        if outcome == "computed":
            assert end - start >= 0.009  # the stand-in stage's sleep


# Three ranks: the last worker (rank 2) starts its loop only after ASLEEP_S, as if stuck. The
# head cancels run 1 before sending runs 0 and 1: rank 1 must skip run 1 without rank 2's
# help (the head sends cancellations to every worker, none is relayed by another).
ASLEEP_S = 1.5
CANCEL_SCRIPT = WORKER_SCRIPT.split("out = pathlib.Path")[0] + f"""
out = pathlib.Path(sys.argv[1])
rank = world()[0]
if rank == 0:
    link = HeadTransport(N_VOCAB)
    link.send_cancel([1])
    time.sleep(0.3)
    link.send_decode(tx(0, 1, False), np.zeros((1, 8), dtype=np.float32))
    link.send_decode(tx(1, 1, True), np.zeros((1, 8), dtype=np.float32))
    results = collect(link, 2)
    stats = link.shutdown()
    out.write_text(json.dumps({{"results": results, "spans": [s["spans"] for s in stats]}}))
else:
    if rank == 2:
        time.sleep({ASLEEP_S})
    Worker(WorkerLink(), FakeStage()).run()
"""


def test_a_cancellation_reaches_a_worker_whose_successor_is_stuck(tmp_path):
    got = run_script(tmp_path, CANCEL_SCRIPT, 3)
    assert got["results"] == [[0, False], [1, True]]
    rank1, rank2 = ([[run, outcome] for run, _, _, outcome, _, _ in s] for s in got["spans"])
    assert rank1 == [[0, "computed"], [1, "skipped"]]
    assert rank2 == [[0, "computed"], [1, "skipped"]]


class SpanStage:
    """A stand-in stage for LocalTransport: each decode takes a moment; `aborts` abort."""

    def __init__(self, aborts=()):
        self.aborts = set(aborts)

    def decode(self, positions, seq_ids, *, embd=None, logit_rows=None, run_id=-1, slot=0):
        time.sleep(0.002)
        if run_id in self.aborts:
            raise StageAborted()
        return np.zeros((len(positions), 4), dtype=np.float32)


def test_local_transport_spans():
    transport = LocalTransport([SpanStage(), SpanStage(aborts={2})], delay=0)
    before = time.monotonic()
    transport.send_decode(DecodeTx(0, (0, 1), ((0,), (0,)), (True, True)), None)
    transport.send_cancel([1])
    transport.send_decode(DecodeTx(1, (2,), ((1,),), (True,), speculative=True), None)
    transport.send_decode(DecodeTx(2, (2,), ((2,),), (True,), speculative=True), None)
    stats = transport.shutdown()
    after = time.monotonic()
    compact = [[[run, outcome, n, spec] for run, _, _, outcome, n, spec in s["spans"]]
               for s in stats]
    assert compact[0] == [[0, "computed", 2, False], [1, "skipped", 1, True],
                          [2, "computed", 1, True]]
    assert compact[1] == [[0, "computed", 2, False], [1, "skipped", 1, True],
                          [2, "aborted", 1, True]]
    for s in stats:
        for run, start, end, outcome, _, _ in s["spans"]:
            assert before <= start <= end <= after
            assert (start == end) == (outcome == "skipped")
        assert len(s["spans"]) == s["computed"] + s["skipped"] + s["aborted"]
