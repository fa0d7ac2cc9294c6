"""An in-process worker pipeline whose timing a test scripts: one FIFO of transactions per
worker stage, as between MPI ranks, so that a run moves down the pipeline a stage at a time
while the head speculates, and cancellations find runs part-way down it.

What a stage does with a transaction is not decided here: every stage is a StageCore
(pipeinfer/engine/worker/core.py), the object an MPI worker and LocalTransport evaluate their
stage through, so runs are computed, skipped or aborted, and KV operations applied, by the
worker's own rules. This module only decides when each stage is given what.
"""

from __future__ import annotations

from collections import deque
from typing import Iterable

import numpy as np

from pipeinfer.engine.worker.core import StageCore
from pipeinfer.model.stage import Stage
from pipeinfer.schedule.transaction import DecodeTx, KvOp, RunResult


class CancelWatcher:
    """A worker's cancel watcher, made synchronous: the MPI worker's watcher thread wakes
    when the core's `computing` event is set (a decode starts) and hands the core the
    cancellations that arrive meanwhile, which aborts the decode. Here the cancellations of
    the run a stage is computing are held in `arriving` and handed over at that moment, so
    the abort is certain (a thread could come after the decode ended)."""

    def __init__(self):
        self.core: StageCore | None = None
        self.arriving: set[int] = set()

    def set(self) -> None:   # the core starts a decode (StageCore's `computing` event)
        if self.arriving:
            run_ids, self.arriving = sorted(self.arriving), set()
            self.core.cancel(run_ids)

    def clear(self) -> None:  # the decode ended
        pass


class SteppedTransport:
    """Worker stages in this process, each a StageCore with its own FIFO of transactions.

    A poll of the head that finds no result may advance the pipeline. `script` (ints) decides
    per such poll: 0 = advance nothing (the head gets another chance to speculate), k >= 1 =
    let stage (k-1) mod n process its oldest transaction (or the first stage that has one).
    When the script is exhausted, `lag` idle polls are allowed between pipeline ticks (a tick
    lets every stage, last first, process one transaction, so a run moves one stage per tick).

    Cancellations reach every stage at once. A stage's oldest queued decode counts as the one
    it is computing now: with `abort`, a cancellation of that run reaches the core once the
    decode has started (CancelWatcher), and the core aborts it through llama.cpp's abort
    callback; every other cancellation reaches the cores at once, which skip the run when it
    comes, or ignore the cancellation of a run they are done with. With `argmax` the last
    stage returns only each row's argmax, as workers do under greedy sampling.
    """

    def __init__(self, stages: list[Stage], lag: int = 0, script: Iterable[int] = (),
                 abort: bool = False, argmax: bool = False):
        self.stages = stages
        self.lag, self.abort, self.argmax = lag, abort, argmax
        self.script = iter(script)
        self.watchers = [CancelWatcher() for _ in stages]
        self.cores = [StageCore(stage, computing=w) for stage, w in zip(stages, self.watchers)]
        for core, watcher in zip(self.cores, self.watchers):
            watcher.core = core
        self.queues: list[deque] = [deque() for _ in stages]
        self.results: deque[RunResult] = deque()
        self.idle = 0
        self.cancel_msgs = 0

    @property
    def stats(self) -> list[dict]:
        """Each stage's statistics with its spans, as a worker reports them at shutdown."""
        return [{"rank": i + 1, **core.report()} for i, core in enumerate(self.cores)]

    # Transport protocol
    def send_decode(self, tx: DecodeTx, activations: np.ndarray) -> None:
        self.queues[0].append((tx, activations))

    def send_kv(self, ops: list[KvOp]) -> None:
        self.queues[0].append((None, list(ops)))

    def send_cancel(self, run_ids: list[int]) -> None:
        self.cancel_msgs += 1
        for queue, core, watcher in zip(self.queues, self.cores, self.watchers):
            tx, x = queue[0] if queue else (None, None)
            computing = tx.run_id if tx is not None and x is not None else None
            if self.abort and computing in run_ids:
                watcher.arriving.add(computing)
            core.cancel([r for r in run_ids if not (self.abort and r == computing)])

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
        """Stage `s` applies its oldest transaction and passes it on (its result, for the
        last stage)."""
        tx, payload = self.queues[s].popleft()
        last = s == len(self.stages) - 1
        if tx is None:
            self.cores[s].kv(payload)
            if not last:
                self.queues[s + 1].append((None, payload))
            return
        # the head's input is never a skip; downstream, no activations means skipped upstream
        out, _ = self.cores[s].decode(tx, payload, upstream_skipped=s > 0 and payload is None)
        self.watchers[s].arriving.discard(tx.run_id)   # skipped before it could start
        if not last:
            self.queues[s + 1].append((tx, out))
        elif out is not None and tx.states:     # an embedding's run: final hidden states
            self.results.append(RunResult(tx.run_id, None, states=out))
        elif out is not None and self.argmax:   # what a greedy worker sends
            self.results.append(RunResult(tx.run_id, None, np.argmax(out, axis=1)))
        else:
            self.results.append(RunResult(tx.run_id, out))
