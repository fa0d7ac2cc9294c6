"""An in-process worker pipeline whose timing a test scripts (SteppedTransport)."""

from __future__ import annotations

from collections import deque
from typing import Iterable

import numpy as np

from pipeinfer.engine.worker.core import apply_kv
from pipeinfer.model.stage import Stage, StageAborted
from pipeinfer.schedule.transaction import DecodeTx, KvOp, RunResult


class SteppedTransport:
    """Worker stages in this process, each with its own FIFO of transactions, like MPI ranks.

    A poll of the head that finds no result may advance the pipeline. `script` (ints) decides
    per such poll: 0 = advance nothing (the head gets another chance to speculate), k >= 1 =
    let stage (k-1) mod n process its oldest transaction (or the first stage that has one).
    When the script is exhausted, `lag` idle polls are allowed between pipeline ticks (a tick
    lets every stage, last first, process one transaction, so a run moves one stage per tick).

    Cancellations reach every stage at once and concern a stage only for runs it has not
    processed yet (as in worker.py). A stage's oldest queued decode counts as the one it is
    computing now: with `abort`, a cancellation of that run aborts it mid-decode (the decode
    runs with llama.cpp's abort callback armed, so llama.cpp's and the stage's abort clean-up
    run); every other cancelled run is skipped when its turn comes. With `argmax` the last
    stage returns only each row's argmax, as workers do under greedy sampling.
    """

    def __init__(self, stages: list[Stage], lag: int = 0, script: Iterable[int] = (),
                 abort: bool = False, argmax: bool = False):
        self.stages = stages
        self.lag, self.abort, self.argmax = lag, abort, argmax
        self.script = iter(script)
        self.queues: list[deque] = [deque() for _ in stages]
        self.results: deque[RunResult] = deque()
        self.cancelled: list[dict[int, bool]] = [{} for _ in stages]  # run id -> abort
        self.done_through = [-1] * len(stages)
        self.idle = 0
        self.stats = [{"rank": i + 1, "computed": 0, "skipped": 0, "aborted": 0, "kv_ops": 0}
                      for i in range(len(stages))]
        self.cancel_msgs = 0

    # Transport protocol
    def send_decode(self, tx: DecodeTx, activations: np.ndarray) -> None:
        self.queues[0].append((tx, activations))

    def send_kv(self, ops: list[KvOp]) -> None:
        self.queues[0].append((None, list(ops)))

    def send_cancel(self, run_ids: list[int]) -> None:
        self.cancel_msgs += 1
        for s, queue in enumerate(self.queues):
            tx, x = queue[0] if queue else (None, None)
            computing = tx.run_id if tx is not None and x is not None else None
            for r in run_ids:
                if r > self.done_through[s]:
                    self.cancelled[s][r] = self.abort and r == computing

    def result_waiting(self) -> bool:
        # the head asks between draft steps: time passes for the pipeline as for a poll
        if not self.results:
            self._advance()
        return bool(self.results)

    def poll_result(self) -> RunResult | None:
        if not self.results:
            self._advance()
        return self.results.popleft() if self.results else None

    def shutdown(self) -> list[dict]:
        while any(self.queues):
            self.tick()
        return self.stats

    # pipeline mechanics
    def _advance(self) -> None:
        choice = next(self.script, None)
        if choice is None:
            if self.idle < self.lag:
                self.idle += 1
                return
            self.idle = 0
            self.tick()
        elif choice > 0:
            n = len(self.stages)
            order = [(choice - 1 + i) % n for i in range(n)]
            stage = next((s for s in order if self.queues[s]), None)
            if stage is not None:
                self.step(stage)

    def tick(self) -> None:
        for s in reversed(range(len(self.stages))):
            if self.queues[s]:
                self.step(s)

    def step(self, s: int) -> None:
        tx, payload = self.queues[s].popleft()
        last = s == len(self.stages) - 1
        if tx is None:
            apply_kv(self.stages[s], payload)
            self.stats[s]["kv_ops"] += len(payload)
            if not last:
                self.queues[s + 1].append((None, payload))
            return
        out = self._decode(s, tx, payload)
        self.done_through[s] = max(self.done_through[s], tx.run_id)
        self.cancelled[s].pop(tx.run_id, None)
        if last and out is not None and self.argmax:  # what a greedy worker sends
            self.results.append(RunResult(tx.run_id, None, np.argmax(out, axis=1)))
        elif last:
            self.results.append(RunResult(tx.run_id, out))
        else:
            self.queues[s + 1].append((tx, out))

    def _decode(self, s: int, tx: DecodeTx, x):
        stage, stats = self.stages[s], self.stats[s]
        marked = tx.run_id in self.cancelled[s]
        abort = self.cancelled[s].get(tx.run_id, False)
        if x is None or (marked and not abort):
            stats["skipped"] += 1
            return None
        if abort:
            stage.cancel(tx.run_id)
        try:
            out = stage.decode(tx.positions, tx.seq_ids, embd=x, logit_rows=tx.logit_rows,
                               run_id=tx.run_id)
        except StageAborted:
            stats["aborted"] += 1
            return None
        stats["computed"] += 1
        return out
