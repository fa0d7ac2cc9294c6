"""The interface between the head's scheduler and the worker pipeline.

The scheduler never calls MPI: it talks to a `Pipeline` (head.py), which talks to a Transport.
`mpi_transport.HeadTransport` is the real one; `LocalTransport` runs worker stages in-process,
so schedulers can be tested and simulated without MPI.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Protocol

import numpy as np

from .stage import Stage, StageAborted
from .transaction import DecodeTx, KvOp, KvOpType, RunResult


class Transport(Protocol):
    def send_decode(self, tx: DecodeTx, activations: np.ndarray) -> None: ...
    def send_kv(self, ops: list[KvOp]) -> None: ...
    def send_cancel(self, run_ids: list[int]) -> None: ...
    def poll_result(self) -> RunResult | None: ...
    def result_waiting(self) -> bool: ...
    def shutdown(self) -> list[dict]: ...


def apply_kv(stage: Stage, ops: list[KvOp]) -> None:
    for op in ops:
        if op.kind == KvOpType.KV_SEQ_CP:
            stage.seq_cp(op.seq, op.dst, op.p0, op.p1)
        elif op.kind == KvOpType.KV_SEQ_RM:
            stage.seq_rm(op.seq, op.p0, op.p1)
        else:
            stage.seq_keep(op.seq)


def record_span(spans, tx: DecodeTx, start: float, end: float, outcome: str) -> None:
    """Append one decode's span in the compact form a stage's stats["spans"] carries (pickled
    with a worker's statistics, hence a list of plain values, not an object): [run_id, start,
    end, outcome, n_tokens, speculative], times in this process's time.monotonic() seconds,
    outcome one of "computed", "aborted", "skipped" (a skipped run's span has zero length)."""
    spans.append([tx.run_id, start, end, outcome, tx.n_tokens, tx.speculative])


class LocalTransport:
    """Worker stages evaluated in this process, in order, when their transaction is sent.

    With `delay` > 0 the pipeline looks slow: at most `delay` transactions wait unevaluated,
    and a poll finds a result only after `delay` polls that found none (each such poll then
    evaluates one more run). This lets a test exercise a scheduler's handling of results
    arriving while it speculates, and of cancellations reaching runs not computed yet.
    Each stage's stats carry "spans" as a worker's do (record_span), in this process's clock.
    """

    def __init__(self, stages: list[Stage], delay: int = 0):
        self.stages = stages
        self.delay = delay
        self._queue: deque[tuple[DecodeTx | None, object]] = deque()
        self._results: deque[RunResult] = deque()
        self._cancelled: set[int] = set()
        self._empty_polls = 0
        self.stats = [{"rank": i + 1, "computed": 0, "skipped": 0, "aborted": 0, "busy_s": 0.0,
                       "kv_ops": 0, "spans": []} for i in range(len(stages))]

    def send_decode(self, tx: DecodeTx, activations: np.ndarray) -> None:
        self._queue.append((tx, activations))
        self._drain(self.delay)

    def send_kv(self, ops: list[KvOp]) -> None:
        self._queue.append((None, list(ops)))
        self._drain(self.delay)

    def send_cancel(self, run_ids: list[int]) -> None:
        self._cancelled.update(run_ids)

    def result_waiting(self) -> bool:
        return bool(self._results) or (self._has_decode() and self._empty_polls >= self.delay)

    def poll_result(self) -> RunResult | None:
        if not self._results and self._has_decode():
            self._empty_polls += 1
            if self._empty_polls > self.delay:
                self._advance()
        if not self._results:
            return None
        self._empty_polls = 0
        return self._results.popleft()

    def shutdown(self) -> list[dict]:
        self._drain(0)
        return self.stats

    def _has_decode(self) -> bool:
        return any(tx is not None for tx, _ in self._queue)

    def _advance(self) -> None:
        """Evaluate queued transactions up to and including the next decode."""
        while self._queue:
            tx = self._queue[0][0]
            self._drain(len(self._queue) - 1)
            if tx is not None:
                return

    def _drain(self, keep: int) -> None:
        while len(self._queue) > keep:
            tx, payload = self._queue.popleft()
            if tx is None:
                for stage, stats in zip(self.stages, self.stats):
                    apply_kv(stage, payload)
                    stats["kv_ops"] += len(payload)
                continue
            self._results.append(self._run(tx, payload))

    def _run(self, tx: DecodeTx, x) -> RunResult:
        for stage, stats in zip(self.stages, self.stats):
            start = time.monotonic()
            if tx.run_id in self._cancelled:
                record_span(stats["spans"], tx, start, start, "skipped")
                stats["skipped"] += 1
                x = None
                continue
            try:
                x = stage.decode(tx.positions, tx.seq_ids, embd=x, logit_rows=tx.logit_rows,
                                 run_id=tx.run_id)
                record_span(stats["spans"], tx, start, time.monotonic(), "computed")
                stats["computed"] += 1
            except StageAborted:
                record_span(stats["spans"], tx, start, time.monotonic(), "aborted")
                stats["aborted"] += 1
                x = None
        self._cancelled.discard(tx.run_id)
        return RunResult(tx.run_id, x)
