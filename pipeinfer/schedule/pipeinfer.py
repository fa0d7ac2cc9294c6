"""PipeInfer (paper IV): asynchronous, continuous speculation with KV multibuffering and early
inference cancellation.

The schedule:
- Start: the draft model reads the prompt while the target prefills it.
- After the prefill, and after every result that leaves the pending token without a run: a
  non-speculative run of it, so the target always evaluates the newest accepted token.
- Whenever the driver finds nothing new (a tick) and no draft job is out: draft a micro-batch
  continuing the newest speculation in flight (the *tip*), under the cutoff, at most the
  micro-batch limit deep, if another run may go out (a free KV partition, fewer than
  --max-runs in flight; without continuous speculation, no speculative run in flight).
- While a job is out, a tick that finds a target stage idle stops it: what it drafted ships.
- A finished job becomes a speculative run continuing the tip. If results moved the tip
  meanwhile, its branches are rebased onto the new tip (their tokens after what was
  accepted) or dropped. An attempt that drafted nothing is not repeated unchanged.
- A result is verified (speculation.py), runs it made useless are cancelled, and a job whose
  context left the speculation is stopped early.
Lookups answer at once, so a chain of n-gram runs goes out together: its first runs are short
(1, 2, then full size) after every break, when the pending token needed a run of its own
(ramp.py). The cutoff (cutoff.py) rises per speculative run started, resets when a completed
speculative run is accepted, decays once per failed draft attempt of the draft model down to
its floor; at the floor, failed attempts space out the next ones (retry.py).
Drafts may also come from the text itself (n-gram lookup, ngram.py): the executor answers
those at once, and the runs remember their origin for the counters. While the guard (guard.py)
pauses speculation, no draft goes out: plain decoding, until it probes again.
"""

from __future__ import annotations

import itertools

from .actions import DraftJob, StartDraft, StopDraft, WarmDraft
from .core import Scheduler
from .cutoff import Cutoff
from .events import DraftInterrupted
from .microbatch import MicroBatch
from .ramp import Ramp
from .retry import Retry
from .runs import trim_branches


class PipeInfer(Scheduler):
    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        o = self.opts
        self.cutoff = Cutoff(o.p_accept, o.p_recovery, o.p_decay, o.p_floor)
        self.batch = MicroBatch(o.draft, o.continuous, self.limits.n_stages)
        self.ramp = Ramp(self.batch.limit)   # n-gram runs start short after a break
        self.jobs = itertools.count()
        self.job: DraftJob | None = None
        self.stopping = False          # StopDraft sent for the job out
        self.failed_at: tuple | None = None  # the last attempt that drafted nothing
        self.retry = Retry()           # how many tokens the draft model waits after failing

    def on_start(self) -> None:
        if not self.rebuilding():   # (a resumed one reads its context at its first draft)
            self.spec.emit(WarmDraft(self.gen.request.prompt))
        super().on_start()

    def rebuilding(self) -> bool:
        """Resumed generations sharing the pipeline are rebuilding their KV cells: no draft
        work until they are done (PipelineShare.rebuilding)."""
        return self.share is not None and self.share.rebuilding()

    def on_result(self, absorbed) -> None:
        # A verified speculative run had its root guess accepted (it covered the pending
        # token), even when its single token leaves `drafted` at 0.
        if absorbed.verified and absorbed.run.speculative:
            if self.cutoff.accepted():
                self.record("cutoff", self.cutoff.value, "speculative run accepted")
        self.failed_at = None
        if self.spec.cover() is None and self.ramp.broke():
            self.record("ramp", self.ramp.size, "the pending token needs a run of its own")
        self.start_cover()
        job = self.job
        if job is not None and not self.gen.done and not _extends(self.spec.tip()[0],
                                                                   job.context):
            self._stop_job(stale=True)  # it continues a speculation that is gone

    def on_tick(self) -> None:
        if self.job is None:
            if self._may_speculate():
                self._submit()
        elif not self.stopping and self.batch.ship_now(self.pipeline_load):
            self._stop_job()  # a target stage idles: ship the tokens drafted so far

    def drafting(self) -> bool:
        return self.job is not None

    def on_draft(self, event) -> None:
        job = self.job
        if job is None or event.job_id != job.job_id:
            return
        self.job, self.stopping = None, False
        if isinstance(event, DraftInterrupted):
            return  # stopped before it drafted anything: draft again
        context, source = self.spec.tip()
        branches = trim_branches(_rebase(job, event.branches, context), self.spec.kv_free - 1)
        if branches and self._may_speculate():
            self.spec.start_speculative(context, branches, source, event.origin)
            self.ramp.started()
            self.failed_at = None
            self.retry.drafted()
            if self.cutoff.run_started():
                self.record("cutoff", self.cutoff.value, "speculative run started")
        elif not event.branches:
            self.failed_at = (len(job.context), job.source, job.cutoff)
            # (no n-gram matched: that says nothing about the draft model's cutoff)
            if event.origin == "model":
                decayed = self.cutoff.attempt_failed()
                self.retry.failed(len(job.context), at_floor=not decayed)
                if decayed:
                    self.failed_at = None  # the cutoff changed: worth another try
                    self.record("cutoff", self.cutoff.value, "draft attempt failed")
                elif self.retry.wait > 1:
                    self.record("retry", self.retry.wait, "draft attempts fail at the floor")

    def _submit(self) -> None:
        context, source = self.spec.tip()
        cutoff = self.cutoff.value
        # keep one cell for the non-speculative run a rejection may need
        room = min(self.limits.max_run, self.limits.n_ctx - len(context), self.spec.kv_free - 1)
        budget = min(self.batch.limit, room)
        if (len(context), source, cutoff) == self.failed_at or budget <= 0:
            return
        model = self.retry.ready(len(context))   # (a lookup costs nothing: it never waits)
        score = self.guard.wants_score   # (the draft model says first whether it could pay)
        if not (model or score) and self.opts.draft_source == "model":
            return
        ngram = self.sources.use_ngram()
        if not (model or ngram or score):
            return
        self.job = DraftJob(next(self.jobs), tuple(context), source, cutoff, budget, ngram,
                            ngram_budget=self.ramp.size, room=room, model=model, score=score)
        self.spec.emit(StartDraft(self.job))

    def _stop_job(self, stale: bool = False) -> None:
        self.stopping = True
        self.spec.emit(StopDraft(self.job.job_id, stale))

    def _may_speculate(self) -> bool:
        if self.pool.n_free == 0 or self.pipeline_load >= self.run_limit or self.rebuilding():
            return False
        if not self.speculation_pays():
            return False
        return self.batch.continuous or not any(r.speculative for r in self.spec.live())


def _extends(tokens, prefix) -> bool:
    return len(tokens) >= len(prefix) and list(tokens[:len(prefix)]) == list(prefix)


def _rebase(job: DraftJob, branches, context: list[int]) -> list[list[int]]:
    """The job's branches continuing `context`, the newest speculation now: the tokens after
    it of every branch that agrees with what the tip gained meanwhile (the accepted tokens
    the draft had guessed, typically); none if the tip left the job's context."""
    if not _extends(context, job.context):
        return []
    gained = list(context[len(job.context):])
    n = len(gained)
    return [list(b[n:]) for b in branches if len(b) > n and list(b[:n]) == gained]
