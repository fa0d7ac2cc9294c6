"""PipeSpec's draft models as the driver's draft executor.

The hierarchy (hierarchy.Hierarchy in this process, or hierarchy_remote.RemoteHierarchy for
draft models on ranks of their own) follows SyncDrafts at once. Whenever the driver is idle
it takes one step (a draft or verification step of one model here; taking in the draft
ranks' messages there), and a change of the last draft model's buffer comes back as
DraftsStepped. DraftsDone stops the models and puts PipeSpec's per-stage statistics and its
analytic expectation into the generation's report (`pipespec_stages`, `pipespec_expected`).
"""

from __future__ import annotations

from pathlib import Path

from .hierarchy import Hierarchy, StageStats, expectation
from .hierarchy_remote import RemoteHierarchy
from ...schedule.actions import DraftsDone, SyncDrafts
from ...schedule.events import DraftsStepped
from ...schedule.generation import Generation

# Prompt tokens each draft model evaluates per warm-up step while the target prefills (the
# first token waits for at most about one step of every model).
WARM_TOKENS = 2


def build_hierarchy(drafter, cfg) -> Hierarchy | RemoteHierarchy:
    """The hierarchy over the draft models the runner loaded: a Drafter or a sequence of them
    (smallest first), or a ready Hierarchy."""
    if isinstance(drafter, (Hierarchy, RemoteHierarchy)):
        return drafter
    drafters = list(drafter) if isinstance(drafter, (list, tuple)) else [drafter]
    return Hierarchy([d.stage for d in drafters], cfg.n_batch, cfg.spec.draft)


class HierarchyDrafts:
    def __init__(self, hier, gen: Generation, cfg):
        self.hier, self.gen, self.cfg = hier, gen, cfg
        self.horizon = 0
        self.warming: list[int] | None = None
        self.stepping = False          # steps begin after the prefill
        self._changed = False

    def submit(self, action) -> None:
        if isinstance(action, SyncDrafts):
            self._sync(action)
        elif isinstance(action, DraftsDone):
            self._done(action)
        else:
            raise TypeError(f"PipeSpec's drafts cannot do {action!r}")

    def _sync(self, action: SyncDrafts) -> None:
        self.horizon = action.horizon
        if action.reset:
            self.hier.reset(list(action.accepted))
        else:
            self.hier.sync(list(action.accepted))
        self.warming = list(action.accepted) if action.warm else None
        self.stepping = not action.warm

    def idle(self) -> bool:
        """One unit of the drafts' work while the driver has nothing else to do; whether
        anything was done."""
        if self.warming is not None:   # (True: the driver comes back at once)
            return self.hier.warm(self.warming, WARM_TOKENS)
        if not self.stepping:
            return False
        self._changed = self.hier.step(self.horizon) or self._changed
        return self._changed

    def poll(self):
        """The last draft model's buffer as it is now, if a step changed it."""
        if not self._changed:
            return None
        self._changed = False
        return DraftsStepped(tuple(self.hier.buffer))

    def stop(self, job_id: int, stale: bool = False) -> None:
        pass

    def close(self) -> None:
        self.stepping = False

    def _done(self, action: DraftsDone) -> None:
        self.stepping = False
        self.hier.finish(list(action.accepted))
        gen, c = self.gen, self.gen.counters
        target = StageStats(Path(self.cfg.model).name, proposed=c.n_drafted,
                            accepted=c.n_accepted, rejections=action.rejections,
                            produced=len(gen.tokens), steps=action.verified,
                            busy_s=gen.timeline.gen_s)
        row = target.row()
        # its verification window: the tokens per speculative run
        row["window"] = None if c.mean_microbatch is None else round(c.mean_microbatch, 4)
        rows = self.hier.rows() + [row]
        for i, r in enumerate(rows):
            r["role"] = "draft" if i == 0 else "target" if i == len(rows) - 1 else "verify"
        gen.extras["pipespec_stages"] = rows
        gen.extras["pipespec_expected"] = expectation(rows, self.cfg.spec.draft)
