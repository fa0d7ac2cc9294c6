"""Where draft jobs run: inline on the head's thread, or on a thread of their own.

A draft step is long next to everything else the head does (Qwen2.5 0.5B: ~20 ms a token on
one core, ~50 ms on half a core). Inline, the driver runs a job when it polls for it and asks
between draft steps whether to stop (a result waits, or the scheduler says a stage idles).
On a thread (llama.cpp releases the GIL while it computes), the driver keeps absorbing
results and starting runs while the job computes, and the scheduler stops it with StopDraft;
a stale job (the speculation it continues is gone) has its draft step under way aborted, so
that the draft reaches the next job, on the corrected context, at once.
Both turn a finished job into DraftReady, or DraftInterrupted when it was stopped before it
drafted anything. The prompt warm-up (WarmDraft) goes in steps, so stopping stays prompt.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from typing import Callable, Sequence

from ..transport import wakeup
from .drafter import WARM_STEP, DraftParams
from ...schedule.actions import DraftJob
from ...schedule.events import DraftInterrupted, DraftReady
from ..transport.wakeup import Channel


class _Job:
    """A job in progress, with the flag that ends it early."""

    def __init__(self, job: DraftJob):
        self.job = job
        self.stop = threading.Event()
        self.branches: list[list[int]] | None = None
        self.error: BaseException | None = None
        self.interrupted = False
        self.evaluated = 0   # tokens the draft model evaluated for this job
        self.agreement: tuple[int, int, int] | None = None   # its score, if the job asked
        self.run_id: int | None = None   # its draft decodes' run id, once it runs (abort)

    def run(self, drafter, params: DraftParams, should_stop: Callable[[], bool]) -> None:
        before = getattr(drafter, "evaluated", 0)
        scoring = self.job.score and hasattr(drafter, "agreement")
        if scoring:
            drafter.scoring, drafter.agreement = self.job.cutoff, [0, 0, 0]
        running = getattr(drafter, "running", contextlib.nullcontext)
        try:
            with running() as self.run_id:
                self.branches, _ = drafter.draft(list(self.job.context), params,
                                                 self.job.cutoff, max_tokens=self.job.budget,
                                                 should_stop=should_stop,
                                                 room=self.job.free_room)
            # A first guess under the cutoff is a failed attempt even when a stop came
            # meanwhile: reported as interrupted, it would be tried again at once, unchanged,
            # and on a pipeline with idle stages every job is stopped as it starts.
            self.interrupted = getattr(drafter, "interrupted", self.stop.is_set())
        except BaseException as err:  # noqa: BLE001 (raised again on the driver's thread)
            self.error = err
        self.evaluated = getattr(drafter, "evaluated", 0) - before
        if scoring:
            self.agreement, drafter.scoring = tuple(drafter.agreement), None

    def event(self):
        if self.error is not None:
            raise self.error
        if self.interrupted and self.stop.is_set() and not self.branches:
            return DraftInterrupted(self.job.job_id, evaluated=self.evaluated,
                                    agreement=self.agreement)
        return DraftReady(self.job.job_id, tuple(tuple(b) for b in self.branches or ()),
                          evaluated=self.evaluated, agreement=self.agreement)


class InlineDrafts:
    """Jobs run on the driver's thread when it polls; `should_stop` is the driver's."""

    def __init__(self, drafter, params: DraftParams, should_stop: Callable[[], bool]):
        self.drafter, self.params, self.should_stop = drafter, params, should_stop
        self._warm: list[int] | None = None
        self._job: _Job | None = None
        self.cpu_s = 0.0   # CPU seconds of the jobs and warm-up steps
        self.inline = True  # ... spent on the driver's thread

    def warm(self, tokens: Sequence[int]) -> None:
        self._warm = list(tokens)

    def idle(self) -> bool:
        """One warm-up step while the driver has nothing else to do; True if it took one (the
        driver then looks at the pipeline and comes back at once, rather than sleep until a
        message wakes it: the prompt should be in the draft by the first draft job)."""
        if self._warm is None:
            return False
        t0 = time.thread_time()
        stepped = self.drafter.warm_step(self._warm)
        self.cpu_s += time.thread_time() - t0
        if not stepped:
            self._warm = None   # the draft holds the prompt
        return stepped

    def submit(self, job: DraftJob) -> None:
        self._warm = None  # from now on jobs move the draft's context along
        self._job = _Job(job)

    def stop(self, job_id: int, stale: bool = False) -> None:
        if self._job is not None and self._job.job.job_id == job_id:
            self._job.stop.set()

    def poll(self):
        job, self._job = self._job, None
        if job is None:
            return None
        t0 = time.thread_time()   # (should_stop's ticks of the driver count as the draft's)
        job.run(self.drafter, self.params, lambda: job.stop.is_set() or self.should_stop())
        self.cpu_s += time.thread_time() - t0
        return job.event()

    def close(self) -> None:
        self._job = None


class ThreadedDrafts:
    """Jobs run one at a time on a daemon thread."""

    def __init__(self, drafter, params: DraftParams):
        self.drafter, self.params = drafter, params
        self._current: _Job | None = None
        self._todo: queue.SimpleQueue = queue.SimpleQueue()
        self._done: queue.SimpleQueue = queue.SimpleQueue()
        self._warm_error: BaseException | None = None
        self._closing = threading.Event()
        self.cpu_s = 0.0   # the thread's CPU seconds (read after close)
        self.inline = False
        self._thread = threading.Thread(target=self._loop, name="drafter", daemon=True)
        self._thread.start()

    def warm(self, tokens: Sequence[int]) -> None:
        self._todo.put(list(tokens))

    def idle(self) -> bool:
        return False

    def submit(self, job: DraftJob) -> None:
        assert self._current is None, "one draft job at a time"
        self._current = _Job(job)
        self._todo.put(self._current)

    def stop(self, job_id: int, stale: bool = False) -> None:
        """End job `job_id` after its draft step under way; `stale` (the speculation it
        continues is gone): end that step too, its work is of no use."""
        job = self._current
        if job is not None and job.job.job_id == job_id:
            job.stop.set()
            if stale and job.run_id is not None:   # (set only by a drafter that aborts)
                self.drafter.abort(job.run_id)

    def poll(self):
        if self._warm_error is not None:
            raise self._warm_error
        if self._done.empty():   # (the driver polls between every sleep: no exception then)
            return None
        job = self._done.get_nowait()   # (only this thread takes: it is there)
        self._current = None
        return job.event()

    def close(self) -> None:
        """Stop the job in progress (it ends after the draft step being computed) and the
        thread; the drafter is free for the caller again afterwards."""
        self._closing.set()
        if self._current is not None:
            self._current.stop.set()
        self._todo.put(None)
        self._thread.join()
        self._current = None

    def _loop(self) -> None:
        try:
            self._serve()
        finally:
            self.cpu_s = time.thread_time()

    def _serve(self) -> None:
        while (item := self._todo.get()) is not None:
            if isinstance(item, list):
                self._warm_up(item)
                continue
            item.run(self.drafter, self.params, item.stop.is_set)
            self._done.put(item)
            wakeup.wake_self(Channel.MAIN)  # the driver may be sleeping: the draft is ready

    def _warm_up(self, tokens: list[int]) -> None:
        try:
            while self.drafter.n_held < len(tokens) and not self._closing.is_set():
                self.drafter.prepare(tokens, max_tokens=WARM_STEP, timed=False)
        except BaseException as err:  # noqa: BLE001 (raised again on the driver's thread)
            self._warm_error = err
