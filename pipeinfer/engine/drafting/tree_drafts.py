"""Where specpipe's tree draft jobs run: on the head's thread, the moment they are submitted.

A job is one draft batch (a tree level's bottom nodes, a few rows) plus metadata-only KV
operations, short next to a pipeline step, and it comes right after the level's run went
out, so the draft computes while the target does; there is nothing to stop midway. Carrying
it out at submit also keeps the order of jobs exact (the scheduler's ops assume it) and
lets the cleanup job sent with Finish run although the driver polls no more after it.
Its result waits for the driver's next poll as TreeDraftReady. The prompt warm-up
(WarmDraft) goes in steps while the driver idles, as with InlineDrafts.
"""

from __future__ import annotations

from collections import deque
from typing import Sequence

from ...schedule.tree_draft import Adopt, TreeDraftJob, TreeDraftReady
from ..worker.core import apply_kv


class TreeDrafts:
    def __init__(self, drafter):
        self.drafter = drafter
        self._warm: list[int] | None = None
        self._done: deque[TreeDraftReady] = deque()

    def warm(self, tokens: Sequence[int]) -> None:
        self._warm = list(tokens)

    def idle(self) -> bool:
        """One warm-up step while the driver has nothing else to do; True if it took one (the
        driver comes back at once rather than sleep until a message wakes it)."""
        if self._warm is None:
            return False
        stepped = self.drafter.warm_step(self._warm)
        if not stepped:
            self._warm = None   # the draft holds the prompt
        return stepped

    def submit(self, job: TreeDraftJob) -> None:
        self._warm = None   # from now on the jobs' syncs move the draft's context along
        self._done.append(self._run(job))

    def _run(self, job: TreeDraftJob) -> TreeDraftReady:
        d = self.drafter
        for op in job.ops:
            if isinstance(op, Adopt):
                d.adopt(op.seq, op.token)
            else:
                apply_kv(d.stage, [op])
        synced = [] if job.sync is None else [d.full_row(d.sync(job.sync))]
        rows = []
        if job.decodes:
            seqs, positions, tokens = zip(*job.decodes)
            rows = [d.full_row(row) for row in d.stage.decode(
                list(positions), [(s,) for s in seqs], tokens=list(tokens))]
        return TreeDraftReady(job.job_id, (), rows=tuple(rows + synced))

    def stop(self, job_id: int, stale: bool = False) -> None:
        pass   # jobs are done when submitted

    def poll(self) -> TreeDraftReady | None:
        return self._done.popleft() if self._done else None

    def close(self) -> None:
        self._done.clear()
