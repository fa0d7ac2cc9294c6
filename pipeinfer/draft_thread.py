"""The draft model on a thread of its own, so that the head absorbs results and starts runs
while the draft computes.

A draft step is long next to everything else the head does (Qwen2.5 0.5B: ~20 ms a token on
one core, ~50 ms on half a core), and a result that arrives during a step used to wait for
its end: the first token after the prompt waited for a micro-batch being drafted, and every
verification for the step in progress. With the draft on a thread (llama.cpp releases the GIL
while it computes), the head's loop stays responsive; it hands the thread one micro-batch job
at a time and starts the run when the job comes back, if the speculation it continues is
still the newest one (else the job is stale and dropped; its tokens stay in the draft's cache
and make the next job cheaper).
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field
from typing import Sequence

from .drafter import WARM_STEP, DraftParams, Drafter


@dataclass
class DraftJob:
    """One micro-batch to draft: the tree continuing `context` (`source`: where its run copies
    the context's KV entries from), under `cutoff`, at most `budget` tokens deep."""
    context: list[int]
    source: tuple[int, int] | None
    cutoff: float
    budget: int
    stop: threading.Event = field(default_factory=threading.Event)  # ship what is drafted
    branches: list[list[int]] | None = None
    error: BaseException | None = None

    @property
    def key(self) -> tuple:
        return tuple(self.context), self.source

    @property
    def interrupted(self) -> bool:
        """Stopped before drafting anything (an empty result that is not a failed attempt)."""
        return self.stop.is_set() and not self.branches


class DraftThread:
    """Runs Drafter.draft (and the prompt warm-up) on a daemon thread, one job at a time."""

    def __init__(self, drafter: Drafter, params: DraftParams):
        self.drafter, self.params = drafter, params
        self.current: DraftJob | None = None
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._done: queue.SimpleQueue = queue.SimpleQueue()
        self._warm_error: BaseException | None = None
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="drafter", daemon=True)
        self._thread.start()

    @property
    def busy(self) -> bool:
        return self.current is not None

    def warm(self, prompt: Sequence[int]) -> None:
        """Evaluate the prompt on the draft model (while the target prefills it)."""
        self._jobs.put(list(prompt))

    def submit(self, job: DraftJob) -> None:
        assert self.current is None, "one draft job at a time"
        self.current = job
        self._jobs.put(job)

    def poll(self) -> DraftJob | None:
        """The finished job, if any (its error, if it failed, is raised here)."""
        if self._warm_error is not None:
            raise self._warm_error
        try:
            job = self._done.get_nowait()
        except queue.Empty:
            return None
        self.current = None
        if job.error is not None:
            raise job.error
        return job

    def close(self) -> None:
        """Stop the job in progress (it ends after the draft step being computed) and the
        thread; the drafter is free for the caller again afterwards."""
        self._closing.set()
        if self.current is not None:
            self.current.stop.set()
        self._jobs.put(None)
        self._thread.join()
        self.current = None

    def _loop(self) -> None:
        while (job := self._jobs.get()) is not None:
            if isinstance(job, list):  # the prompt warm-up, in steps so that close() is prompt
                try:
                    while self.drafter.n_held < len(job) and not self._closing.is_set():
                        self.drafter.prepare(job, max_tokens=WARM_STEP)
                except BaseException as err:  # noqa: BLE001 (re-raised on the head's thread)
                    self._warm_error = err
                continue
            try:
                job.branches, _ = self.drafter.draft(job.context, self.params, job.cutoff,
                                                     max_tokens=job.budget,
                                                     should_stop=job.stop.is_set)
            except BaseException as err:  # noqa: BLE001 (re-raised on the head's thread)
                job.error = err
            self._done.put(job)
