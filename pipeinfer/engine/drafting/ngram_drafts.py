"""Draft jobs answered from the text itself (n-gram lookup, schedule/ngram.py), and, with a
fallback executor (the draft model's: `--draft-source both`), the jobs the lookup cannot
answer go to the model (unless the job says the model waits: schedule/retry.py).

A lookup is a few vector compares over the context, so a job is answered the moment it is
submitted: its DraftReady (origin "ngram") waits for the driver's next poll, and there is
nothing to stop. Without a fallback a miss is a DraftReady with no branches (no run goes
out). The prompt warm-up and everything else of the model's jobs is the fallback's.
"""

from __future__ import annotations

from collections import deque
from typing import Sequence

from ...schedule.actions import DraftJob
from ...schedule.events import DraftReady
from ...schedule.ngram import check_sizes, ngram_draft

ORIGIN = "ngram"


class LookupExecutor:
    """What the n-gram executors share: the sizes, the answers waiting for a poll, and the
    model's executor (None: none), which gets the warm-up, idle steps, stops and close."""

    def __init__(self, n_min: int, n_max: int, fallback=None):
        check_sizes(n_min, n_max)
        self.n_min, self.n_max, self.fallback = n_min, n_max, fallback
        self._ready: deque = deque()

    def warm(self, tokens: Sequence[int]) -> None:
        if self.fallback is not None:
            self.fallback.warm(tokens)

    def idle(self) -> bool:
        return self.fallback.idle() if self.fallback is not None else False

    def stop(self, job_id: int, stale: bool = False) -> None:
        """A job of the lookup is answered already; one of the fallback's stops there."""
        if self.fallback is not None:
            self.fallback.stop(job_id, stale)

    def close(self) -> None:
        self._ready.clear()
        if self.fallback is not None:
            self.fallback.close()

    @property
    def cpu_s(self) -> float | None:
        """The draft model's CPU seconds (lookups are the head loop's)."""
        return getattr(self.fallback, "cpu_s", None) if self.fallback is not None else 0.0

    @property
    def inline(self) -> bool:
        """Whether the draft model's CPU is spent on the driver's thread."""
        return getattr(self.fallback, "inline", False)


class NgramDrafts(LookupExecutor):
    """`track`: a request's grammar (engine/drafting/grammar_drafts.py GrammarTrack), or None. With
    one, a lookup gives the text the grammar forces (free) where it forces one, else its
    tokens cut to the grammar and followed by the text forced after them; without, the
    lookup as found."""

    def __init__(self, n_min: int, n_max: int, fallback=None, track=None):
        super().__init__(n_min, n_max, fallback)
        self.track = track

    def submit(self, job: DraftJob) -> None:
        draft = (ngram_draft(job.context, self.n_min, self.n_max, job.lookup_budget)
                 if job.looks_up else [])
        if job.looks_up and self.track is not None:
            draft = self.track.shape(job.context, draft, job.free_room)
        if draft:
            self._ready.append(DraftReady(job.job_id, (tuple(draft),), origin=ORIGIN))
            return
        if self.fallback is not None and job.asks_model:
            self.fallback.submit(job)
        else:
            self._ready.append(DraftReady(job.job_id, (), origin=ORIGIN))

    def poll(self):
        if self._ready:
            return self._ready.popleft()
        return self.fallback.poll() if self.fallback is not None else None
