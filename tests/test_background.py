"""Runs computed behind a rank's main loop (engine/worker/background.py): the refill
contexts' runs, at the lowest priority, in order, with KV operations on those contexts after
them.

In-process: the Background's order, waiting, failures and scheduling policy. Under real
mpiexec, a head and a worker holding SmolLM2 with a refill context: a one-token run sent
after four 64-token refill chunks comes back first, and a KV operation on the refill context
between them holds it back until the chunks are done."""

from __future__ import annotations

import os
import textwrap
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from pipeinfer.engine.worker.background import Background, on_refill_context
from pipeinfer.schedule.transaction import ctx_seed, seq_rm
from support.mpi_util import MPIEXEC, PYTHON, launch


def test_work_runs_in_order_and_wait_returns_when_all_is_done() -> None:
    behind, done = Background("test"), []
    gate = threading.Event()
    behind.submit(gate.wait)
    for i in range(5):
        behind.submit(lambda i=i: done.append(i))
    assert behind.pending == 6 and done == []
    gate.set()
    behind.wait()
    assert done == [0, 1, 2, 3, 4] and behind.pending == 0
    behind.close()


def test_a_failure_is_raised_in_the_callers_thread_and_stops_what_follows() -> None:
    behind, done = Background("test"), []
    behind.submit(lambda: 1 / 0)
    behind.submit(lambda: done.append("after"))
    with pytest.raises(RuntimeError, match="division by zero"):
        behind.wait()
    with pytest.raises(RuntimeError):
        behind.submit(lambda: None)
    behind.close()
    assert done == []


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="no SCHED_IDLE on this system")
def test_the_work_runs_at_the_lowest_priority() -> None:
    behind, policy = Background("test"), []
    behind.submit(lambda: policy.append(os.sched_getscheduler(0)))
    behind.wait()
    behind.close()
    assert policy == [os.SCHED_IDLE]
    assert os.sched_getscheduler(0) != os.SCHED_IDLE   # (the caller's thread is not)


def test_which_kv_operations_wait_for_the_refill_contexts() -> None:
    n_slots = 2
    assert not on_refill_context([seq_rm(0, 5), replace(seq_rm(1), slot=1)], n_slots)
    assert on_refill_context([replace(seq_rm(0, 5), slot=3)], n_slots)        # in one
    assert on_refill_context([replace(ctx_seed(0, 2), slot=0)], n_slots)      # taken from one
    assert on_refill_context([replace(ctx_seed(0, 1, 64), slot=3)], n_slots)  # seeded


# --- under mpiexec -----------------------------------------------------------------------

BEHIND_JOB = textwrap.dedent('''
    """Rank 0 a head without layers, rank 1 a worker holding the whole model, with a refill
    context (slot 1). The head sends four 64-token chunks to the refill context, then (with
    `kv`) a KV operation on that context, then a one-token run in slot 0; it reports the
    order the results came back in."""
    import json, sys
    from dataclasses import replace
    import numpy as np
    from pipeinfer.engine.transport import wakeup
    from pipeinfer.engine.transport.backoff import IdleBackoff
    from pipeinfer.engine.transport.head_transport import HeadTransport
    from pipeinfer.engine.transport.mpi import Link
    from pipeinfer.engine.transport.worker_link import WorkerLink
    from pipeinfer.engine.worker.loop import Worker
    from pipeinfer.model.stage import Stage, StageConfig
    from pipeinfer.schedule.transaction import DecodeTx, seq_rm

    MODEL, KV = sys.argv[1], sys.argv[2] == "kv"
    CHUNK, CHUNKS = 64, 4
    config = StageConfig(n_ctx=512, n_batch=CHUNK, n_seq_max=4, refill_ctx=512,
                         refill_batch=CHUNK)
    rank = Link().rank
    link = HeadTransport(1) if rank == 0 else WorkerLink()
    stage = Stage(MODEL, config) if rank == 1 else None
    dims = link.allgather((stage.n_vocab, stage.n_embd) if stage else None)[1]
    wakeup.connect(link)
    if rank == 1:
        Worker(link, stage, argmax_only=True).run()
        link.flush()
        sys.exit(0)
    link.n_vocab = dims[0]
    x = np.random.default_rng(0).standard_normal((CHUNK, dims[1])).astype(np.float32) * 0.1
    for k in range(CHUNKS):
        span = tuple(range(k * CHUNK, (k + 1) * CHUNK))
        link.send_decode(DecodeTx(k, span, ((0,),) * CHUNK, (False,) * CHUNK, slot=1), x)
    if KV:
        link.send_kv([replace(seq_rm(0, CHUNKS * CHUNK - 1, -1), slot=1)])
    link.send_decode(DecodeTx(CHUNKS, (0,), ((0,),), (True,), slot=0), x[:1])
    order, backoff = [], IdleBackoff()
    while len(order) < CHUNKS + 1:
        result = link.poll_result()
        if result is None:
            backoff.wait()
            continue
        backoff.reset()
        order.append(result.run_id)
    stats = link.shutdown()
    link.flush()
    print(json.dumps({"order": order, "computed": stats[0]["computed"]}), flush=True)
''')


@pytest.mark.smollm2
@pytest.mark.parametrize("kv", [False, True], ids=["runs", "kv-between"])
def test_a_run_behind_refill_chunks_is_not_held_up_by_them(kv: bool, smollm2,
                                                           tmp_path: Path) -> None:
    script = tmp_path / "behind_job.py"
    script.write_text(BEHIND_JOB)
    res = launch([MPIEXEC, "-n", "2", str(PYTHON), str(script), str(smollm2),
                  "kv" if kv else "runs"], timeout=120)
    assert res.rc == 0 and res.json is not None, res.describe()
    order = res.json["order"]
    assert res.json["computed"] == 5
    assert [r for r in order if r < 4] == [0, 1, 2, 3]   # the chunks in order
    if kv:
        assert order == [0, 1, 2, 3, 4], order     # the KV operation waited for them
    else:
        assert order[0] == 4, order                # ahead of the chunks sent before it
