"""Runs a rank computes behind its main loop: those of the refill contexts (model/stage.py).

A refill along a generation (engine/head/refill.py) evaluates each whole chunk of the
conversation again as prompt, one batch of a chunk's tokens in the slot's refill context.
Computed by the rank's main loop, such a batch holds the stage for a chunk's time (hundreds
of milliseconds on a slow node), and the generation's own runs, a few tokens each, wait
behind it at every stage in turn: the answer pays the chunk's time once per stage. Here a
thread of the rank's own computes them at the lowest scheduling priority (SCHED_IDLE), so
the main loop's runs take the core whenever they have work and the refill gets the time
the stage would have idled. The bits are the same: a refill context holds only the refill's
cells, and a context computes alike whichever thread calls it.

Work runs in the order given, one item at a time. `wait` returns once everything given so far
is done: a KV operation on a refill context waits for it, so that it applies after the runs
before it, as in the main loop. An item's exception is raised in the main thread, at the next
`check`, `submit` or `wait`, and no later item runs.
"""

from __future__ import annotations

import os
import queue
import threading
from typing import Callable

from ...schedule.transaction import KvOp, KvOpType

# How long a wait for the background's work sleeps between looks at a failure it could not
# be told of (the thread is woken on every item's end; this is only a safety net).
WAIT_LOOK_S = 0.1


def lowest_priority() -> None:
    """Put the calling thread under SCHED_IDLE where the system has it (Linux); else leave it."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        pass


class Background:
    """One thread that runs the work it is given, in order, at the lowest priority."""

    def __init__(self, name: str):
        self.name = name
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._done = threading.Condition()
        self._pending = 0
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    @property
    def pending(self) -> int:
        """Items given and not done yet."""
        return self._pending

    def submit(self, work: Callable[[], None]) -> None:
        """Run `work()` after everything given before it."""
        self.check()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()
        with self._done:
            self._pending += 1
        self._queue.put(work)

    def wait(self) -> None:
        """Return once everything given so far is done (or raise its failure)."""
        with self._done:
            while self._pending and self._error is None:
                self._done.wait(WAIT_LOOK_S)
        self.check()

    def check(self) -> None:
        """Raise the failure of an item, if one failed."""
        if self._error is not None:
            raise RuntimeError(f"{self.name}: {self._error}") from self._error

    def close(self) -> None:
        """End the thread after what it was given (its failure is not raised here)."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        lowest_priority()
        while (work := self._queue.get()) is not None:
            try:
                if self._error is None:
                    work()
            except BaseException as err:  # noqa: BLE001 (raised again in the main thread)
                self._error = err
            finally:
                with self._done:
                    self._pending -= 1
                    self._done.notify_all()


def on_refill_context(ops: list[KvOp], n_slots: int) -> bool:
    """Whether any of `ops` reads or writes a refill context (index n_slots or more): it must
    wait for the background's runs."""
    return any(op.slot >= n_slots or (op.kind == KvOpType.KV_CTX_SEED and op.dst >= n_slots)
               for op in ops)
