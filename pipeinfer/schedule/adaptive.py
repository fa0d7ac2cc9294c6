"""PipeInfer for a generation that shares the pipeline with others (serve --parallel, the
lanes of engine/head/lanes.py): alone it is PipeInfer; while other generations are under way it
verifies its drafts in the run of its own pending token, as the speculative strategy does.

Why: with several requests under way their own runs keep every stage busy, so PipeInfer's
separate speculative runs could only start while a stage idles (PipelineShare) and rarely
did; its tokens then came one per run. A run rooted at the pending token with drafted
tokens behind it (up to the exact run size, options.py: 3 tokens in all with repacked
weights) yields the accepted ones with no run of their own, and a stage evaluates 3 tokens
in one run for well under three 1-token runs. The switch is at run boundaries, both ways:
- shared, when the pending token needs a run and nothing of this generation is in flight
  (no run, no draft job): a draft job rooted at the accepted tokens; its answer becomes one
  run of the pending token and the drafted tree (nothing drafted: the token alone). While it
  drafts, results of cancelled runs change nothing and start nothing.
- shared, with PipeInfer's runs still in flight (it just stopped being alone): no new
  PipeInfer draft goes out and a finished one is dropped; the pending token gets a run of its
  own, as PipeInfer gives it, until the runs in flight are back.
- alone again: PipeInfer's schedule continues from the run in flight.
Exact either way: the runs, partitions and verification are the core's (speculation.py).
"""

from __future__ import annotations

from .actions import DraftJob, StartDraft, WarmDraft
from .events import DraftInterrupted
from .pipeinfer import PipeInfer
from .runs import trim_branches

DRAFT_LAG = 16   # context tokens the draft model may still have to read for a rooted job


class AdaptivePipeInfer(PipeInfer):
    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.rooted: DraftJob | None = None   # the draft job the pending token's run waits for
        self.rooted_runs = 0                  # runs it started rooted at the pending token
        self.warmed_to = 0                    # context length of the last WarmDraft sent

    @property
    def shared(self) -> bool:
        """Whether other generations are under way in the pipeline (Scheduler.share)."""
        return self.share is not None and self.share.shared()

    def start_cover(self) -> None:
        if self.rooted is not None:
            return    # the job's answer starts the pending token's run
        if (self.shared and self.job is None and not self.spec.live() and not self.gen.done
                and self.spec.cover() is None and not self.rebuilding()
                and not self._draft_behind() and self._submit_rooted()):
            return
        super().start_cover()

    def _draft_behind(self) -> bool:
        """Whether the draft model has more than DRAFT_LAG tokens of the context to read
        before it could draft (a resumed request after its rebuild, a long prompt): then the
        pending token runs alone and the draft model catches up meanwhile (WarmDraft), where
        a rooted draft job would hold the pending token's run until it had read them all (for
        a resumed request's 115 tokens, 4.5 s on half a core; 4 requests, one draft model:
        18 s of an idle pipeline)."""
        lag = self.share.draft_lag(self) if self.share is not None else 0
        if lag <= DRAFT_LAG:
            return False
        accepted = self.spec.accepted
        if len(accepted) > self.warmed_to:
            self.warmed_to = len(accepted)
            self.spec.emit(WarmDraft(tuple(accepted)))
        return True

    def on_result(self, absorbed) -> None:
        if self.rooted is None:
            super().on_result(absorbed)

    def on_tick(self) -> None:
        if self.rooted is not None:
            return    # nothing evaluates the pending token yet: no tip to continue
        if not self.shared:
            super().on_tick()
        elif self.job is not None and not self.stopping:
            self._stop_job()   # what it drafts would be dropped: free the draft model

    def on_draft(self, event) -> None:
        job = self.rooted
        if job is None or event.job_id != job.job_id:
            super().on_draft(event)
            return
        self.rooted = None
        branches = () if isinstance(event, DraftInterrupted) else event.branches
        branches = trim_branches(branches, self.spec.kv_free - 1)   # the root takes a cell
        context = list(job.context)
        tree = [[context[-1]] + list(b) for b in branches] or [[context[-1]]]
        self.spec.start_speculative(context[:-1], tree, None, getattr(event, "origin", "model"))
        self.rooted_runs += 1

    def _may_speculate(self) -> bool:
        return not self.shared and super()._may_speculate()

    def _submit_rooted(self) -> bool:
        """A draft job after the accepted tokens for the pending token's run; False when
        nothing may be drafted (the guard pauses speculation, no room, no free partition)."""
        context = self.spec.accepted
        room = min(self.limits.max_run - 1, self.limits.n_ctx - len(context),
                   self.spec.kv_free - 1)
        budget = min(self.opts.draft, room)
        if budget <= 0 or self.pool.n_free == 0 or not self.speculation_pays():
            return False
        self.rooted = DraftJob(next(self.jobs), tuple(context), None, self.opts.p_accept,
                               budget, self.sources.use_ngram(), room=room,
                               score=self.guard.wants_score)
        self.spec.emit(StartDraft(self.rooted))
        return True
