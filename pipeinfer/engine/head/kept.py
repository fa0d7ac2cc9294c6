"""Which requests' KV cells the ranks keep copies of on their disks (model/kept_cells.py),
and when the copies are written, so that after a failure a request resumes from them
(job/restore.py takes them back) instead of evaluating its whole context again.

A request a front sent (serve --ranks) has a key; while it is generated, each time its
canonical sequence holds the cells of SAVE_EVERY more accepted tokens, the head writes the
tokens and asks every rank (a KvOp after the runs that made those cells) to write its copy;
when it ends, every copy is removed. Copies are written whole: a request's context of n
tokens costs each rank about n x its layers' KV bytes per token, on disk and each time.

A request taken back resumes in the slot holding its cells, reusing the positions every
rank holds, cut so that what it evaluates again lies in the batches a rebuild uses: the
prompt's chunks from a multiple of the chunk size, the answer in runs of the exact run size
(schedule/speculation.py), so every cell is the bits an undisturbed generation has.

The head's draft model keeps its context of each request the same way (`drafts`; the draft
model writes its copies itself: engine/drafting/drafter.py), and a request taken back gets
its draft context back in its slot's draft model.
"""

from __future__ import annotations

import logging

from ...model.kept_cells import KeptCells, token_digest
from ...schedule.generation import CANONICAL_SEQ, Request
from ...schedule.transaction import KvOp, seq_drop, seq_save
from .prompt_cache import common_prefix

log = logging.getLogger(__name__)

SAVE_EVERY = 8   # accepted tokens between two copies of a request's cells


class Keeper:
    def __init__(self, tokens: KeptCells | None, restored: dict, chunk: int,
                 every: int = SAVE_EVERY, drafts: KeptCells | None = None):
        self.tokens = tokens               # where the head writes tokens (None: no keeping)
        self.drafts = drafts               # where the draft model writes its contexts
        self.restored = dict(restored)     # key -> job/restore.Restored, not claimed yet
        self.chunk, self.every = chunk, every
        self._keys: dict[int, int] = {}    # slot -> key of the request it generates
        self._saved: dict[int, int] = {}   # slot -> positions its last copy holds

    def claim(self, key: int, free, request: Request) -> tuple[int, int] | None:
        """(slot, positions reused) for request `key` if its cells were taken back into a
        free slot; None otherwise."""
        restored = self.restored.pop(key, None)
        if restored is None or restored.slot not in free:
            return None
        tokens = request.prompt + request.resumed
        n = min(len(restored.tokens), common_prefix(restored.tokens, tokens), len(tokens) - 1)
        if n < len(request.prompt):
            n = n // self.chunk * self.chunk
        return restored.slot, max(n, 0)

    def take_back_drafts(self, drafter_of) -> None:
        """Each request taken back gets its kept draft context in its slot's draft model
        (`drafter_of(slot)`: a Drafter or None); other requests' draft copies are removed."""
        if self.drafts is None:
            return
        self.drafts.drop_every(but=self.restored)
        for key, restored in self.restored.items():
            drafter = drafter_of(restored.slot)
            copy, why = self.drafts.read(key) if drafter is not None else (None, "")
            if copy is not None:
                drafter.take_back(copy.tokens, copy.body)
            log.info("draft context of request %d: %s", key,
                     f"{len(copy.tokens)} tokens taken back" if copy else f"not kept ({why})")

    def keep_drafts(self, slot: int, drafter) -> None:
        """`slot`'s draft model (a Drafter, or None) keeps its context of the slot's request
        from now on, if anything is kept."""
        key = self._keys.get(slot)
        if drafter is not None and self.drafts is not None and key is not None:
            drafter.keep_as(self.drafts, key)

    def forfeit(self, slot: int) -> None:
        """Another request takes `slot`: the cells taken back there are gone."""
        self.restored = {k: r for k, r in self.restored.items() if r.slot != slot}

    def started(self, slot: int, key: int, cached: int) -> None:
        if self.tokens is not None and key:
            self._keys[slot], self._saved[slot] = key, cached

    def progressed(self, lane) -> list[KvOp]:
        """The copy to write now for `lane`'s request, if it is due."""
        key = self._keys.get(lane.slot)
        if key is None:
            return []
        n = lane.driver.sched.spec.c0   # (sequence 0 holds the cells of [0, c0))
        if n - self._saved[lane.slot] < self.every:
            return []
        tokens = lane.gen.accepted[:n]
        digest = token_digest(tokens)
        self.tokens.save(key, n, digest, b"", len(lane.gen.request.prompt), tokens)
        self._saved[lane.slot] = n
        return [seq_save(CANONICAL_SEQ, key, n, digest)]

    def ended(self, slot: int, drafter=None) -> list[KvOp]:
        """`slot`'s request ended: its copies are removed (`drafter`: the slot's draft
        model, whose job has ended: it keeps no more)."""
        key = self._keys.pop(slot, None)
        self._saved.pop(slot, None)
        if key is None:
            return []
        self.tokens.drop(key)
        if drafter is not None and self.drafts is not None:
            drafter.keep_as(None)
            self.drafts.drop(key)
        return [seq_drop(key)]
