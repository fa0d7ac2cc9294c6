"""Specpipe's draft work as an action and an event: one job per tree level.

A TreeDraftJob is carried out in this order: `ops`, draft KV operations (a branch's slot
sequence receiving its parent's path, deferred from the level that branched; Adopt, moving
an accepted node's entry into sequence 0 at a reroot); then `sync`, the accepted tokens the
draft's sequence 0 must hold (Drafter.sync; the logits after them are a new tree root's);
then `decodes`, one row per bottom node the draft has not evaluated: (draft sequence,
position, token). TreeDraftReady brings the logits per decode row, then the sync's.
Jobs are carried out in the order they were sent, so a job's ops see every earlier job's
decodes: the scheduler counts a node as evaluated from the moment its job goes out.
"""

from __future__ import annotations

from dataclasses import dataclass

from .transaction import KvOp
from .events import DraftReady


@dataclass(frozen=True)
class Adopt:
    """Drafter.adopt: sequence 0 takes, for its next position, the entry `seq` holds there
    (`token`), without a decode."""
    seq: int
    token: int

    def __repr__(self) -> str:
        return f"adopt({self.seq}, {self.token})"


@dataclass(frozen=True)
class TreeDraftJob:
    job_id: int
    ops: tuple[KvOp | Adopt, ...]
    decodes: tuple[tuple[int, int, int], ...]
    sync: tuple[int, ...] | None = None

    def __repr__(self) -> str:
        sync = "" if self.sync is None else f", sync to {len(self.sync)} tokens"
        return (f"TreeDraftJob({self.job_id}: {len(self.ops)} op(s), {len(self.decodes)} "
                f"decode(s){sync})")


@dataclass(frozen=True)
class StartTreeDraft:
    job: TreeDraftJob

    def __repr__(self) -> str:
        return f"StartTreeDraft({self.job!r})"


@dataclass(frozen=True)
class SparseLogits:
    """A draft row that names its candidates: `tokens` have `logits` (best first, in the
    order ties are broken), every other token has probability zero. N-gram drafts give such
    rows: they know a few continuations and nothing of the rest of the vocabulary."""
    tokens: tuple[int, ...]
    logits: tuple[float, ...]
    origin: str = "ngram"

    def __repr__(self) -> str:
        return f"SparseLogits({len(self.tokens)} token(s), {self.origin})"


@dataclass(frozen=True)
class TreeDraftReady(DraftReady):
    """Tree draft job `job_id` is done: `rows` holds the draft's logits per decode, then
    after the sync (a DraftReady, so the core hands it to the strategy; `branches` stays
    empty). A row is the draft model's logits (an array over the vocabulary) or a
    SparseLogits."""
    rows: tuple = ()

    def __repr__(self) -> str:
        return f"TreeDraftReady(job={self.job_id}, rows={len(self.rows)})"
