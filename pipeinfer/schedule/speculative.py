"""Synchronous speculative pipeline parallelism (SpecInfer-style baseline).

The schedule: while the target prefills the prompt the draft model reads it too; then draft a
token tree after the accepted tokens (under the fixed cutoff p_accept, at most --draft deep),
verify it in one run rooted at the pending token, accept the longest verified path plus the
target's next token, repeat. Drafting and verification wait for each other: one run in flight.
While the guard (guard.py) pauses speculation, the run is the pending token alone.
"""

from __future__ import annotations

import itertools

from .actions import DraftJob, StartDraft, WarmDraft
from .core import Scheduler
from .runs import trim_branches


class Speculative(Scheduler):
    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.jobs = itertools.count()
        self.job: DraftJob | None = None

    def on_start(self) -> None:
        self.spec.emit(WarmDraft(self.gen.request.prompt))
        super().on_start()

    def after_prefill(self) -> None:
        self._draft()

    def on_result(self, absorbed) -> None:
        if not self.gen.done:
            self._draft()

    def _draft(self) -> None:
        context = self.spec.accepted
        room = min(self.limits.n_ctx - len(context), self.spec.kv_free - 1,
                   self.limits.max_run - 1)  # (the pending token is the tree's root)
        budget = min(self.opts.draft, room)
        if budget < 0:
            self.stop("kv-cache")
            return
        if not self.speculation_pays():   # paused by the guard: plain decoding meanwhile
            self.start_main()
            return
        self.job = DraftJob(next(self.jobs), tuple(context), None, self.opts.p_accept, budget,
                            self.sources.use_ngram(), room=room, score=self.guard.wants_score)
        self.spec.emit(StartDraft(self.job))

    def drafting(self) -> bool:
        return self.job is not None

    def on_draft(self, event) -> None:
        if self.job is None or event.job_id != self.job.job_id:
            return
        context, self.job = list(self.job.context), None
        branches = () if self.guard.paused else getattr(event, "branches", ())
        branches = trim_branches(branches, self.spec.kv_free - 1)  # the root takes a cell
        pending = context[-1]
        tree = [[pending] + list(b) for b in branches] or [[pending]]
        self.spec.start_speculative(context[:-1], tree, None, getattr(event, "origin", "model"))
