"""The rules one pipeline rank applies to the transactions it is given (DESIGN.md section 3),
without any messaging: the MPI worker (worker.py) and the in-process stages of
transport.LocalTransport both evaluate their stage through a StageCore, so a run is computed,
skipped or aborted, and KV operations are applied, in exactly one way.

- A cancelled run not started yet is remembered and skipped when it comes; the run being
  computed is aborted at its next graph node (Stage.cancel, llama.cpp's abort callback);
  cancellations of runs already done are ignored (run ids grow in the order the head issues
  them, and a rank sees runs in that order, so "done" is "at most the highest id seen").
- A run skipped upstream (no activations came) is skipped here too.
- KV operations are applied in the order given, after every earlier decode.
- Every decode leaves a span and counts in the statistics.

cancel() may be called from another thread while decode() runs (the MPI worker's cancel
watcher does); everything else is meant for one thread.
"""

from __future__ import annotations

import threading
import time
from collections import deque

import numpy as np

from ...model.kept_cells import KeptCells
from ...model.stage import Stage, StageAborted
from ...schedule.transaction import DecodeTx, KvOp, KvOpType

COMPUTED, ABORTED, SKIPPED = "computed", "aborted", "skipped"

# Spans kept for the trace (the newest ones): bounds a long-lived rank's memory (~200 bytes a
# span) while any single run of the program fits with room to spare.
SPANS_MAX = 100_000


def apply_kv(stage: Stage, ops: list[KvOp], kept: KeptCells | None = None) -> None:
    """Apply `ops` in order, each in its own context (slot) of `stage`; copies of cells
    go to `kept` (none without it)."""
    for op in ops:
        if op.kind == KvOpType.KV_SEQ_SAVE:
            if kept is not None:
                kept.save_stage(stage, op.slot, op.seq, op.dst, op.p0, op.p1)
        elif op.kind == KvOpType.KV_SEQ_DROP:
            if kept is not None:
                kept.drop(op.dst)
        elif op.kind == KvOpType.KV_SEQ_CP:
            stage.seq_cp(op.seq, op.dst, op.p0, op.p1, slot=op.slot)
        elif op.kind == KvOpType.KV_SEQ_RM:
            stage.seq_rm(op.seq, op.p0, op.p1, slot=op.slot)
        elif op.kind == KvOpType.KV_SEQ_COMPACT:
            stage.seq_compact(op.seq, slot=op.slot)
        elif op.kind == KvOpType.KV_CTX_SEED:
            stage.seed(op.seq, op.dst, op.p1, slot=op.slot)
        else:
            stage.seq_keep(op.seq, slot=op.slot)


def record_span(spans, tx: DecodeTx, start: float, end: float, outcome: str) -> None:
    """Append one decode's span in the compact form a stage's stats["spans"] carries (pickled
    with a worker's statistics, hence a list of plain values, not an object): [run_id, start,
    end, outcome, n_tokens, speculative], times in this process's time.monotonic() seconds,
    outcome one of "computed", "aborted", "skipped" (a skipped run's span has zero length)."""
    spans.append([tx.run_id, start, end, outcome, tx.n_tokens, tx.speculative])


class StageCore:
    """One rank's stage and the per-rank rules around it.

    `computing`, if given, is set while the stage computes: a thread that may have to abort
    the decode can sleep on it the rest of the time (the MPI worker's cancel watcher does).
    """

    def __init__(self, stage: Stage | None, computing: threading.Event | None = None,
                 spans_max: int | None = SPANS_MAX, kept: KeptCells | None = None):
        self.stage = stage
        self.kept = kept                 # where KV_SEQ_SAVE copies cells (serve --ranks)
        self._computing = computing
        # _cancelled, _done_through and _active are shared with the thread calling cancel()
        self._lock = threading.Lock()
        self._cancelled: set[int] = set()
        self._done_through = -1          # highest run id already processed here
        self._active = -1                # run id being decoded now
        self.stats = {COMPUTED: 0, SKIPPED: 0, ABORTED: 0, "busy_s": 0.0, "kv_ops": 0}
        # [run_id, start, end, outcome, n_tokens, speculative], see record_span
        self.spans: deque[list] = deque(maxlen=spans_max)

    def report(self) -> dict:
        """The statistics with the spans, as a rank sends them at shutdown."""
        return dict(self.stats, spans=list(self.spans))

    @property
    def pending(self) -> frozenset[int]:
        """Cancelled runs this rank has not reached yet."""
        with self._lock:
            return frozenset(self._cancelled)

    def cancel(self, run_ids) -> None:
        with self._lock:
            for run_id in (int(i) for i in run_ids):
                if run_id == self._active:
                    self.stage.cancel(run_id)
                elif run_id > self._done_through:
                    self._cancelled.add(run_id)

    def decode(self, tx: DecodeTx, x: np.ndarray | None,
               upstream_skipped: bool | None = None) -> tuple[np.ndarray | None, str]:
        """Apply one DECODE: (the stage's output, or None when it did not compute, and the
        outcome). `upstream_skipped` defaults to `x is None`; a caller whose stand-in stages
        take no input passes False."""
        if upstream_skipped is None:
            upstream_skipped = x is None
        with self._lock:
            # checking and taking the run in one step: a cancellation arriving later finds it
            # active and aborts it (Stage.cancel before its decode starts aborts it at once)
            skip = upstream_skipped or tx.run_id in self._cancelled
            if skip:
                self._finish(tx.run_id)
            else:
                self._active = tx.run_id
        if skip:
            now = time.monotonic()
            record_span(self.spans, tx, now, now, SKIPPED)
            self.stats[SKIPPED] += 1
            return None, SKIPPED
        return self._compute(tx, x)

    def _compute(self, tx: DecodeTx, x: np.ndarray | None) -> tuple[np.ndarray | None, str]:
        t0 = time.perf_counter()
        start = time.monotonic()
        if self._computing is not None:
            self._computing.set()
        try:
            # (`states` only for an embedding's run: stand-in stages of tests take no such)
            extra = {"states": True} if tx.states else {}
            out = self.stage.decode(tx.positions, tx.seq_ids, embd=x, logit_rows=tx.logit_rows,
                                    run_id=tx.run_id, slot=tx.slot, **extra)
            outcome = COMPUTED
        except StageAborted:
            out, outcome = None, ABORTED
        finally:
            end = time.monotonic()
            self.stats["busy_s"] += time.perf_counter() - t0
            if self._computing is not None:
                self._computing.clear()
            with self._lock:
                self._active = -1
                self._finish(tx.run_id)
        record_span(self.spans, tx, start, end, outcome)
        self.stats[outcome] += 1
        return out, outcome

    def _finish(self, run_id: int) -> None:
        # (holding _lock) later cancellations of this run are for a run done here
        self._done_through = max(self._done_through, run_id)
        self._cancelled.discard(run_id)

    def kv(self, ops: list[KvOp]) -> None:
        apply_kv(self.stage, ops, self.kept)
        self.stats["kv_ops"] += len(ops)
