"""The one loop that does the head's I/O for every strategy: transport -> driver -> core ->
actions -> driver.

Per turn: take a waiting result (ResultArrived), else a finished draft job (DraftReady,
DraftInterrupted), else tell the scheduler nothing happened (Tick); carry out the actions the
scheduler returns; back off (a sleep that grows) only when a turn changed nothing. After
Finish, runs still in flight are drained: their results go to the scheduler, which discards
them, so partitions come back and no result is left in the pipeline.
"""

from __future__ import annotations

import logging
import time
from typing import Iterator

from ..transport.backoff import IdleBackoff
from .pipeline import Pipeline
from ...schedule import actions as A
from ...schedule.core import Scheduler
from ...schedule.events import Cancel, ResultArrived, Start, Tick
from ...schedule.generation import Generation
from ...schedule.tree_draft import StartTreeDraft
from .trace import Trace

log = logging.getLogger("pipeinfer.head")


class Driver:
    def __init__(self, pipe: Pipeline, scheduler: Scheduler, gen: Generation, drafts=None,
                 trace: Trace | None = None):
        self.pipe, self.sched, self.gen = pipe, scheduler, gen
        self.drafts, self.trace = drafts, trace

    def run(self) -> None:
        """The whole generation: start, turns until Finish, drain."""
        for _ in self.stream():
            pass

    def stream(self) -> Iterator[int]:
        """The generation, yielding its tokens as they are accepted. A consumer that stops
        early cancels it (the runs in flight are drained all the same); after an error
        nothing is drained (a rank may be gone)."""
        seen = 0
        try:
            self.begin()
            backoff = self.pipe.idle_backoff()
            while not self.sched.finished:
                if self.turn():
                    backoff.reset()
                else:
                    backoff.wait()
                while seen < len(self.gen.tokens):
                    seen += 1
                    yield self.gen.tokens[seen - 1]
        except GeneratorExit:
            self.feed(Cancel())
        finally:
            if self.drafts is not None:
                self.drafts.close()
        self._drain()
        self._account_cpu()

    def begin(self) -> None:
        """The generation's clock starts and its scheduler gets Start (the prefill goes out)."""
        self.gen.timeline.start = time.perf_counter()
        self._cpu0, self._thread_cpu0 = time.process_time(), time.thread_time()
        self.feed(Start())

    def _account_cpu(self) -> None:
        """The head's CPU over the generation: its process, the draft model's jobs, and the
        loop (this thread, less the draft jobs an inline executor ran on it)."""
        tl, drafts = self.gen.timeline, self.drafts
        tl.head_cpu_s = time.process_time() - self._cpu0
        loop = time.thread_time() - self._thread_cpu0
        tl.draft_cpu_s = None if drafts is None else getattr(drafts, "cpu_s", None)
        if tl.draft_cpu_s is not None and getattr(drafts, "inline", False):
            loop -= tl.draft_cpu_s
        tl.loop_cpu_s = loop if drafts is None or tl.draft_cpu_s is not None else None

    def turn(self) -> bool:
        """One poll of everything; False when nothing happened."""
        result = self.pipe.poll()
        if result is not None:
            self.feed(ResultArrived(result.run_id, result))
            return True
        return self.turn_drafts()

    def turn_drafts(self) -> bool:
        """The turn's part after the pipeline: a draft event, else a tick (and what the draft
        executor made of it); False when nothing happened."""
        if self._draft_event():
            return True
        if self.feed(Tick()):
            self._draft_event()  # an inline job submitted at this tick runs now
            return True
        if self.drafts is not None and self.drafts.idle():
            self._draft_event()  # what the step produced goes out at once
            return True
        return False

    def _draft_event(self) -> bool:
        event = self.drafts.poll() if self.drafts is not None else None
        if event is not None:
            self.feed(event)
        return event is not None

    def should_stop_draft(self) -> bool:
        """Asked between the draft steps of an inline job: a result waits, or the scheduler
        stops the job at this tick (StopDraft)."""
        return self.pipe.result_waiting() or any(
            isinstance(a, A.StopDraft) for a in self.feed(Tick()))

    def feed(self, event) -> list:
        """Give the scheduler an event and carry out its actions; the actions."""
        actions = self.sched.step(event)
        if self.trace is not None and (actions or not isinstance(event, Tick)):
            self.trace.record("event", event)
        for action in actions:
            self.apply(action)
        return actions

    def apply(self, action) -> None:
        if self.trace is not None:
            self.trace.record("action", action)
        if isinstance(action, A.StartRun):
            self._start_run(action)
        elif isinstance(action, A.KvOps):
            self.pipe.kv(list(action.ops))
        elif isinstance(action, A.CancelRuns):
            self.pipe.cancel(list(action.run_ids))
            log.debug("cancel %s", list(action.run_ids))
        elif isinstance(action, A.EmitTokens):
            if not self.gen.timeline.prefill_done:
                self.gen.timeline.prefill_done = time.perf_counter()
            self.gen.record(action.tokens)
        elif isinstance(action, A.StartDraft):
            self.drafts.submit(action.job)
        elif isinstance(action, A.StopDraft):
            self.drafts.stop(action.job_id, action.stale)
        elif isinstance(action, A.WarmDraft):
            self.drafts.warm(action.tokens)
        elif isinstance(action, (A.SyncDrafts, A.DraftsDone)):
            self.drafts.submit(action)
        elif isinstance(action, StartTreeDraft):
            self.drafts.submit(action.job)
        elif not isinstance(action, (A.Finish, A.PolicyChanged)):
            raise TypeError(f"unknown action {action!r}")

    def _start_run(self, action: A.StartRun) -> None:
        t0 = time.monotonic()
        self.pipe.decode(action.tx, list(action.tokens))
        log.debug("%r", action)
        if self.trace is not None and self.pipe.stage is not None:
            self.trace.span(0, action.run_id, t0, time.monotonic(), "computed",
                            action.tx.speculative, action.tx.n_tokens)

    def _drain(self) -> None:
        backoff = IdleBackoff()
        while self.sched.in_flight:
            result = self.pipe.poll()
            if result is None:
                backoff.wait()
                continue
            self.feed(ResultArrived(result.run_id, result))
            backoff.reset()
