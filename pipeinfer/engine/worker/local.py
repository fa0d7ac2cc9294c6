"""Worker stages in the head's process: a Transport (engine/head/pipeline.py) whose stages
apply the rules an MPI worker applies (core.py), so schedulers can be tested without MPI."""

from __future__ import annotations

from collections import deque

import numpy as np

from .core import COMPUTED, StageCore
from ...model.stage import Stage
from ...schedule.transaction import DecodeTx, KvOp, RunResult


class LocalTransport:
    """Worker stages evaluated in this process, in order, when their transaction is sent.

    With `delay` > 0 the pipeline looks slow: at most `delay` transactions wait unevaluated,
    and a poll finds a result only after `delay` polls that found none (each such poll then
    evaluates one more run). This lets a test exercise a scheduler's handling of results
    arriving while it speculates, and of cancellations reaching runs not computed yet.
    Each stage applies the rules an MPI worker applies (engine.worker_core.StageCore); this
    class only decides when it is given what. Each stage's stats carry "spans" as a worker's
    do (record_span), in this process's clock.
    """

    def __init__(self, stages: list[Stage], delay: int = 0):
        self.stages = stages
        self.delay = delay
        self._queue: deque[tuple[DecodeTx | None, object]] = deque()
        self._results: deque[RunResult] = deque()
        self._empty_polls = 0
        self.cores = [StageCore(stage) for stage in stages]

    @property
    def stats(self) -> list[dict]:
        return [{"rank": i + 1, **core.report()} for i, core in enumerate(self.cores)]

    def send_decode(self, tx: DecodeTx, activations: np.ndarray) -> None:
        self._queue.append((tx, activations))
        self._drain(self.delay)

    def send_kv(self, ops: list[KvOp]) -> None:
        self._queue.append((None, list(ops)))
        self._drain(self.delay)

    def send_cancel(self, run_ids: list[int]) -> None:
        # every stage at once: no stage is ever mid-decode here, so nothing is aborted
        for core in self.cores:
            core.cancel(run_ids)

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
                for core in self.cores:
                    core.kv(payload)
                continue
            self._results.append(self._run(tx, payload))

    def _run(self, tx: DecodeTx, x) -> RunResult:
        # the head's input is never a skip (stand-in stages in tests may take None)
        skipped = False
        for core in self.cores:
            x, outcome = core.decode(tx, x, upstream_skipped=skipped)
            skipped = outcome != COMPUTED
        return RunResult(tx.run_id, None, states=x) if tx.states and x is not None \
            else RunResult(tx.run_id, x)
