"""PipeSpec (McDanel et al., Algorithm 1): a k-model hierarchy M0 < M1 < ... < target, every
model an asynchronous stage that verifies the one before it.

The draft models run in the head process (hierarchy.py, stepped by the driver whenever it
has nothing else to do) or on ranks of their own (hierarchy_remote.py, all concurrently); the
driver reports every change of the last draft model's buffer (DraftsStepped). The target is
the pipeline, fed like PipeInfer's speculative runs. The schedule:
- Start: the draft models begin at the prompt and read it while the target prefills it.
- After the prefill and after every result: the drafts' buffers follow the accepted tokens
  (SyncDrafts; M0 may draft up to --draft x --max-runs ahead); if no run evaluates the
  pending token, one is rooted at it, carrying what M(k-1) proposes after it (a plain
  non-speculative run when that is nothing), so the target never waits for the drafts.
- Whenever possible (a tick, a new buffer): if M(k-1) has tokens beyond the newest
  speculation in flight, up to --draft of them go out as a speculative run continuing it
  (with a free partition, under --max-runs): at once while at most one run is in flight
  (PipeSpec's "lookahead 0"), else once a full window is ready.
- At the end: the drafts stop at the accepted tokens and report per-stage statistics.
"""

from __future__ import annotations

from .actions import DraftsDone, SyncDrafts
from .buffers import merge, proposal
from .core import Scheduler


class PipeSpec(Scheduler):
    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        req = self.gen.request
        self.top: list[int] = list(req.prompt)  # M(k-1)'s newest buffer
        self.limit = min(self.limits.n_ctx, len(req.prompt) + req.n_predict)
        self.ahead = self.opts.draft * self.opts.max_runs
        self.verified = self.rejections = 0

    def _sync(self, **kw) -> None:
        accepted = self.spec.accepted
        self.top = merge(self.top, accepted)  # what the drafts' cascade does to M(k-1)
        horizon = min(len(accepted) + self.ahead, self.limit)
        self.spec.emit(SyncDrafts(tuple(accepted), horizon, **kw))

    def on_start(self) -> None:
        self._sync(reset=True, warm=True)
        super().on_start()

    def after_prefill(self) -> None:
        self._sync()
        self._cover()

    def on_result(self, absorbed) -> None:
        if absorbed.verified:
            self.verified += 1
            self.rejections += self._rejected(absorbed)
        self._sync()
        self._cover()

    def on_draft(self, event) -> None:
        self.top = list(event.top)
        if self.prefilled:
            self._feed()

    def on_tick(self) -> None:
        self._feed()

    def on_finish(self) -> None:
        self.spec.emit(DraftsDone(tuple(self.spec.accepted), self.verified, self.rejections))

    def _cover(self) -> None:
        """A run rooted at the pending token, with M(k-1)'s proposal after it when there is
        one and a partition is free; none if a run already evaluates it."""
        spec = self.spec
        if self.gen.done or spec.cover() is not None:
            return
        if not spec.fits(1):
            self.stop("kv-cache")
            return
        accepted, tokens = spec.accepted, []
        if self.pool.n_free and self.in_flight < self.opts.max_runs:
            budget = min(self.opts.draft, self.limits.n_ctx - len(accepted), spec.kv_free - 2,
                         self.limits.max_run - 1)
            tokens = proposal(self.top, accepted, budget)
        if tokens:
            spec.start_speculative(accepted[:-1], [[accepted[-1]] + tokens], None)
        else:
            spec.start_main()

    def _feed(self) -> None:
        """A speculative run with M(k-1)'s tokens continuing the newest speculation."""
        spec = self.spec
        if self.pool.n_free == 0 or self.in_flight >= self.opts.max_runs:
            return
        context, source = spec.tip()
        # keep one cell for the non-speculative run a rejection may need
        budget = min(self.opts.draft, self.limits.n_ctx - len(context), spec.kv_free - 1,
                     self.limits.max_run)
        tokens = proposal(self.top, context, budget)
        # Lookahead 0 while the target would otherwise run dry; with runs queued, a full
        # window (fewer runs, and cheaper per token where batching pays off).
        need = 1 if self.in_flight <= 1 else self.opts.draft
        if tokens and len(tokens) >= min(need, budget):
            spec.start_speculative(context, [tokens], source)

    def _rejected(self, absorbed) -> bool:
        """After a verification: whether a token had been proposed for the new pending
        position (by the verified run or a run continuing it) and the target chose another."""
        if self.gen.done or self.spec.cover() is not None:
            return False
        accepted, p = self.spec.accepted, self.spec.pending
        return any(_proposes(run, accepted, p) for run in [absorbed.run, *self.spec.fifo])


def _proposes(run, accepted, p: int) -> bool:
    """Whether `run` holds a token for position p after accepted[:p]."""
    if run.base > p or list(accepted[:run.base]) != list(run.context):
        return False
    node = -1
    for q in range(run.base, p):
        node = next((c for c in run.children(node) if run.nodes[c].token == accepted[q]), None)
        if node is None:
            return False
    return bool(run.children(node))
