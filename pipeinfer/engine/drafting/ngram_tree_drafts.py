"""Specpipe's tree draft jobs answered from the text itself (n-gram lookup,
schedule/ngram.ngram_candidates), and with the draft model's executor as a fallback
(`--draft-source both`): the rows the lookup cannot answer are the model's.

No model holds the draft's sequences, so they are mirrored as token lists (index = position):
a job's KV operations are carried out on the lists (seq_cp copies positions [p0, p1) of one
list into another, seq_rm cuts a list's tail, seq_keep drops the others, Adopt appends to
sequence 0), its sync makes sequence 0 the accepted context, and each decode puts its token
at its position. A row's path is its sequence up to and including the row's token (the
sync's row: the accepted context); its candidates are the tokens that followed earlier
occurrences of the path's longest suffix of --ngram-max down to --ngram-min tokens, as a
SparseLogits with logits log(count) (each candidate's probability is its share of the
occurrences), the most frequent first, then the latest. A row that matches nothing names no
token (the tree gets no child there), or with a fallback is the model's own row: the model
evaluates every row all the same, since its KV cache must hold the whole tree.

Jobs are answered at submit (a lookup per row, a few vector compares over the path), like
TreeDrafts; the result waits for the driver's next poll.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Sequence

from ...schedule.ngram import ngram_candidates
from .ngram_drafts import LookupExecutor
from ...schedule.transaction import KvOpType
from ...schedule.tree_draft import Adopt, SparseLogits, TreeDraftJob, TreeDraftReady

NO_MATCH = SparseLogits((), ())


class TokenMirror:
    """The draft's sequences as token lists: what each would hold in a draft model's cache."""

    def __init__(self):
        self.seqs: dict[int, list[int]] = {}

    def seq(self, seq: int) -> list[int]:
        return self.seqs.setdefault(seq, [])

    def apply(self, op) -> None:
        if isinstance(op, Adopt):
            self.seq(0).append(op.token)
        elif op.kind == KvOpType.KV_SEQ_CP:
            self._copy(op.seq, op.dst, op.p0, op.p1)
        elif op.kind == KvOpType.KV_SEQ_RM:
            self._remove(op.seq, op.p0, op.p1)
        else:   # seq_keep
            self.seqs = {op.seq: self.seq(op.seq)}

    def _copy(self, src: int, dst: int, p0: int, p1: int) -> None:
        tokens, target = self.seq(src), self.seq(dst)
        lo = max(p0, 0)
        hi = len(tokens) if p1 < 0 else min(p1, len(tokens))
        if lo > len(target):
            raise ValueError(f"seq_cp({src}->{dst}) from position {lo} would leave a gap in "
                             f"draft sequence {dst} ({len(target)} positions)")
        target[lo:hi] = tokens[lo:hi]

    def _remove(self, seq: int, p0: int, p1: int) -> None:
        tokens = self.seq(seq)
        lo, hi = max(p0, 0), (len(tokens) if p1 < 0 else p1)
        if lo >= min(hi, len(tokens)):
            return
        if hi < len(tokens):
            raise ValueError(f"seq_rm({seq}, [{p0},{p1})) would leave a gap in draft sequence "
                             f"{seq} ({len(tokens)} positions)")
        del tokens[lo:]

    def sync(self, context: Sequence[int]) -> list[int]:
        self.seqs[0] = list(context)
        return self.seqs[0]

    def decode(self, seq: int, pos: int, token: int) -> list[int]:
        """`token` at `pos` of `seq`: the row's path."""
        tokens = self.seq(seq)
        if pos > len(tokens):
            raise ValueError(f"a decode at position {pos} of draft sequence {seq} "
                             f"({len(tokens)} positions) would leave a gap")
        del tokens[pos:]
        tokens.append(token)
        return tokens


class NgramTreeDrafts(LookupExecutor):
    def __init__(self, n_min: int, n_max: int, fallback=None):
        super().__init__(n_min, n_max, fallback)
        self.mirror = TokenMirror()
        self._matched: dict[int, dict[int, SparseLogits]] = {}   # fallback's jobs: n-gram rows

    def lookup(self, path: Sequence[int]) -> SparseLogits:
        """The row of a path: the tokens the text suggests after it (NO_MATCH: none)."""
        found = ngram_candidates(path, self.n_min, self.n_max)
        if not found:
            return NO_MATCH
        return SparseLogits(tuple(t for t, _ in found), tuple(math.log(c) for _, c in found))

    def rows(self, job: TreeDraftJob) -> list[SparseLogits]:
        """The job carried out on the mirror: a row per decode, then the sync's."""
        for op in job.ops:
            self.mirror.apply(op)
        synced = [] if job.sync is None else [self.lookup(self.mirror.sync(job.sync))]
        return [self.lookup(self.mirror.decode(*d)) for d in job.decodes] + synced

    def submit(self, job: TreeDraftJob) -> None:
        rows = self.rows(job)
        if self.fallback is None:
            self._ready.append(TreeDraftReady(job.job_id, (), origin="ngram",
                                              rows=tuple(rows)))
            return
        self._matched[job.job_id] = {i: row for i, row in enumerate(rows) if row.tokens}
        self.fallback.submit(job)

    def poll(self) -> TreeDraftReady | None:
        if self._ready:
            return self._ready.popleft()
        event = self.fallback.poll() if self.fallback is not None else None
        if event is None or not (matched := self._matched.pop(event.job_id, None)):
            return event
        rows = list(event.rows)
        for i, row in matched.items():
            rows[i] = row
        return replace(event, rows=tuple(rows))

    def close(self) -> None:
        self._matched.clear()
        super().close()
