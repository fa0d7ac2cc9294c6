"""The head's view of the target pipeline: what a scheduler submits runs to.

It embeds tokens, evaluates the head's own slice of layers (if it holds any), and hands the
rest to a Transport: the MPI job's (transport/head_transport.HeadTransport), or stages in
this process (worker/local.LocalTransport). Results come back as RunResults in the order
runs were submitted, but for the runs of refill contexts, which every rank computes behind
its other runs (worker/background.py; on the head too, when it holds layers and has workers
after it). The scheduler never calls MPI.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Callable, Protocol, Sequence

import numpy as np

from ...model.embedding import Embedder
from ..transport.backoff import IdleBackoff, idle_backoff
from ...model.stage import Stage
from ...schedule.transaction import DecodeTx, KvOp, RunResult
from ..worker.background import Background, on_refill_context
from ..worker.core import apply_kv


class Transport(Protocol):
    def send_decode(self, tx: DecodeTx, activations: np.ndarray) -> None: ...
    def send_kv(self, ops: list[KvOp]) -> None: ...
    def send_cancel(self, run_ids: list[int]) -> None: ...
    def poll_result(self) -> RunResult | None: ...
    def result_waiting(self) -> bool: ...
    def shutdown(self) -> list[dict]: ...


class Pipeline:
    def __init__(self, embed: Embedder | None, stage: Stage | None,
                 transport: Transport | None, *, whole_model: bool = False):
        if stage is None and transport is None:
            raise ValueError("a pipeline needs a head stage, a transport, or both")
        self.embed, self.stage, self.transport = embed, stage, transport
        self.whole_model = whole_model  # the head stage is the unsliced model: feed token ids
        self.kept = None   # where the head's stage copies its KV cells (model/kept_cells.py)
        # what rows after the first add to a run on the slowest worker (model/row_costs.py;
        # the job's start sets them): the drafter's depth rule; empty: not measured
        self.row_costs: tuple[float, ...] = ()
        self._local: deque[RunResult] = deque()
        self.loop_busy_s = 0.0   # computing here: in the loop's thread,
        self.behind_s = 0.0      # ... and the refill contexts' runs in the background's
        self.in_flight = 0
        # Work done: runs evaluated here and results taken. `on_progress(count)` after each
        # (the front's heartbeat, serve/link.py: a long prompt's chunks all go out in
        # one turn of the head's loop, through the head's own slice first).
        self.progress = 0
        self.on_progress: Callable[[int], None] | None = None
        self.behind = Background("head refills") if (
            transport is not None and not whole_model and stage is not None
            and stage.has_refill_contexts) else None

    @property
    def busy_s(self) -> float:
        """Seconds the head has spent computing runs (embedding and its own slice)."""
        return self.loop_busy_s + self.behind_s

    @property
    def n_stages(self) -> int:
        """Stages holding target layers: the head's own slice (if any) and every worker."""
        n = 1 if self.stage is not None else 0
        tr = self.transport
        if tr is not None:
            n += len(tr.stages) if hasattr(tr, "stages") else max(getattr(tr, "size", 2) - 1, 1)
        return n

    def decode(self, tx: DecodeTx, tokens: Sequence[int]) -> None:
        """Start a run. Returns once the head's own slice (if any) has been evaluated (a
        refill context's run: once handed to the background, which sends it on)."""
        t0 = time.perf_counter()
        behind = self.behind is not None and tx.slot >= self.stage.n_slots   # a refill's
        if self.whole_model:
            extra = {"states": True} if tx.states else {}   # (an embedding's run)
            out = self.stage.decode(tx.positions, tx.seq_ids, tokens=tokens,
                                    logit_rows=tx.logit_rows, run_id=tx.run_id, slot=tx.slot,
                                    **extra)
        else:
            out = self.embed(tokens)
            if self.stage is not None and not behind:
                out = self.stage.decode(tx.positions, tx.seq_ids, embd=out, run_id=tx.run_id,
                                        slot=tx.slot)
        self.loop_busy_s += time.perf_counter() - t0
        self.in_flight += 1
        self._progressed()
        if self.transport is None:
            self._local.append(RunResult(tx.run_id, None, states=out) if tx.states
                               else RunResult(tx.run_id, out))
        elif behind:
            self.behind.submit(lambda: self._send_behind(tx, out))
        else:
            self.transport.send_decode(tx, out)

    def _send_behind(self, tx: DecodeTx, x: np.ndarray) -> None:
        """(The background's thread) a refill context's run: the head's slice, then on."""
        t0 = time.perf_counter()
        out = self.stage.decode(tx.positions, tx.seq_ids, embd=x, run_id=tx.run_id,
                                slot=tx.slot)
        self.behind_s += time.perf_counter() - t0
        self.transport.send_decode(tx, out)

    def kv(self, ops: list[KvOp]) -> None:
        """Apply KV operations on every stage, after every run already started."""
        if not ops:
            return
        if self.behind is not None and on_refill_context(ops, self.stage.n_slots):
            self.behind.wait()
        if self.stage is not None:
            apply_kv(self.stage, ops, self.kept)
        if self.transport is not None:
            self.transport.send_kv(ops)

    def cancel(self, run_ids: list[int]) -> None:
        # The head's own slice is never mid-decode here: its loop's runs are done when
        # decode() returns, and the refill contexts' runs behind it are never cancelled.
        if run_ids and self.transport is not None:
            self.transport.send_cancel(run_ids)

    def result_waiting(self) -> bool:
        """Whether a result can be taken now (without taking it)."""
        return bool(self._local) or (self.transport is not None
                                     and self.transport.result_waiting())

    def poll(self) -> RunResult | None:
        if self.behind is not None:
            self.behind.check()   # (a refill's run failed on the head: its result never comes)
        result = self._local.popleft() if self._local else (
            self.transport.poll_result() if self.transport is not None else None)
        if result is not None:
            self.in_flight -= 1
            self._progressed()
        return result

    def _progressed(self) -> None:
        self.progress += 1
        if self.on_progress is not None:
            self.on_progress(self.progress)

    def idle_backoff(self) -> IdleBackoff:
        """The head's wait between turns of its loop. Its sleeps keep the transport's sends
        moving; when every rank wakes the head as it sends (a result, an error: wakeup.py),
        and the draft thread does when a job is done, they may grow long, costing the head's
        core next to nothing while it waits; else they stay short (polling finds what
        came)."""
        tr = self.transport
        return idle_backoff(getattr(tr, "woken", False), sleep=getattr(tr, "sleep", None))

    def wait(self, idle: Callable[[], None] | None = None) -> RunResult:
        """Block (politely: the sleep between polls grows with the time waited) for the next
        result; `idle` is called while waiting, if given."""
        backoff = IdleBackoff()
        while (result := self.poll()) is None:
            if idle is not None:
                idle()
            backoff.wait()
        return result

    def shutdown(self) -> list[dict]:
        if self.behind is not None:
            self.behind.wait()
            self.behind.close()
        return self.transport.shutdown() if self.transport is not None else []
