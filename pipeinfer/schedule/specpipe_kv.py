"""Where specpipe's tree lives in the KV caches, and the operations that keep it there.

Target stages: sequence 0 holds accepted tokens only; the beam slots are the sequence ids of
the one partition of width --tree-width that the pool holds for specpipe, its graveyard
receives every dropped entry. A slot holds the context and the path from the root to its
beam's bottom. A root is decoded in (0, slot 0); a node in its own slot only; a child
branching into another slot first gets that slot cleared (seq_cp to the graveyard, then
seq_rm) and the parent's path copied in. Cells are never freed during a generation, so every
sequence's cells stay in position order and logits stay bit-exact.

Draft model: sequence 0 holds the accepted context, slot i is sequence 1+i (the draft needs
width+1 sequences); its branch copies mirror the target's one job late, carried by the next
TreeDraftJob (with Adopt: an accepted node's entry moved into sequence 0 instead of a
decode); its cells may be reused.
"""

from __future__ import annotations

from .transaction import seq_cp, seq_rm
from .actions import KvOps
from .generation import CANONICAL_SEQ
from .tree_draft import Adopt, StartTreeDraft, TreeDraftJob


class BeamSlots:
    def __init__(self, slots: tuple[int, ...], graveyard: int, width: int):
        self.slots, self.grave, self.width = slots, graveyard, width
        self.holding: set[int] = set()        # slots whose target sequences may hold entries
        self.dops: list = []                  # draft KV ops for the next job
        self.dsync: tuple | None = None       # (root, accepted tokens) for the next job
        self.dheld = 0                        # tokens draft sequence 0 holds after the jobs
        self.n_jobs = 0

    @staticmethod
    def dseq(slot: int) -> int:
        return 1 + slot

    def clear(self, slot: int) -> list:
        """Target ops emptying `slot` (none if it holds nothing)."""
        if slot not in self.holding:
            return []
        self.holding.discard(slot)
        s = self.slots[slot]
        return [seq_cp(s, self.grave), seq_rm(s)]

    def clear_all(self) -> list:
        return [op for slot in sorted(self.holding) for op in self.clear(slot)]

    def new_root(self, c0: int, root: int, accepted: tuple[int, ...]) -> list:
        """Target ops before a new tree's root chain (decoded in (0, slot 0)); the next draft
        job syncs the draft to `accepted` and gives the root's logits."""
        ops = self.clear_all() + [seq_cp(CANONICAL_SEQ, self.slots[0], -1, c0)]
        self.holding.add(0)
        self.dsync, self.dheld = (root, accepted), len(accepted)
        return ops

    def branch(self, src: int, dst: int, pos: int) -> list:
        """Target ops giving slot `dst` the path of slot `src` up to `pos` (and the same for
        the draft, with the next job)."""
        ops = self.clear(dst) + [seq_cp(self.slots[src], self.slots[dst], -1, pos)]
        self.dops += [seq_rm(self.dseq(dst)), seq_cp(self.dseq(src), self.dseq(dst), -1, pos)]
        return ops

    def adopt(self, slot: int, token: int, pos: int) -> None:
        """An accepted node the draft evaluated in `slot` joins draft sequence 0 (no decode)."""
        if self.dheld == pos:
            self.dops.append(Adopt(self.dseq(slot), token))
            self.dheld += 1

    def job(self, decodes: tuple) -> tuple[TreeDraftJob, int | None]:
        """The next draft job (pending ops, a sync if a root waits, `decodes`), and the root
        whose logits its sync gives."""
        root, sync = self.dsync or (None, None)
        job = TreeDraftJob(self.n_jobs, tuple(self.dops), decodes, sync)
        self.n_jobs += 1
        self.dsync = None
        # slot 0 of a new tree continues the context the sync leaves in sequence 0
        self.dops = [] if sync is None else [seq_rm(self.dseq(0)),
                                             seq_cp(0, self.dseq(0), -1, len(sync))]
        return job, root

    def finish(self) -> list:
        """The actions ending a generation: every target slot emptied, and a last draft job
        emptying the draft's slots (pending ops are moot: an Adopt left out keeps sequence 0
        whole; no job if none ever went out)."""
        out: list = []
        if ops := self.clear_all():
            out.append(KvOps(tuple(ops)))
        if self.n_jobs:
            out.append(StartTreeDraft(TreeDraftJob(
                self.n_jobs, tuple(seq_rm(self.dseq(s)) for s in range(self.width)), ())))
        return out
