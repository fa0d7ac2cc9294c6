"""The conversations the serving slots keep (`pipeinfer serve`'s prompt cache).

After a request, its slot keeps the KV cells of its prompt and of its answer (the accepted
tokens whose cells sequence 0 holds: all but the last, which was never evaluated) in
sequence 0 on every rank; the next request goes to the free slot whose kept tokens share the
longest prefix with its prompt (ties: the least recently used), which then evaluates only the
rest of its prompt (at least its last token, whose row gives the first token), as
llama-server does with cache_prompt. The next turn of a conversation, which repeats the
previous answer, so evaluates only the new question.

Speculative runs leave nothing in the kept cells: only sequence 0 stays, whose cells hold
accepted tokens only (schedule/speculation.py), and rejected drafts' cells go with their
sequences. They leave holes between the answer's cells, though (a generation never reuses a
cell: partition_pool), and a later batch would fill the holes before going after the kept
cells: attention would add the cells up in another order than llama.cpp alone does (its
tiled kernel for batches even changes the logits by far more than the last bits:
tests/test_stage.py). So the slot's cells are compacted (transaction.seq_compact): moved,
bits and order unchanged, to the front of the cache, where a cache that held nothing else
has them. A greedy answer with a reused prefix so equals llama.cpp's when llama.cpp, too,
keeps that prefix and evaluates the rest in the same batches; compared with a fresh
evaluation of the whole prompt (other batches), its logits may differ in their last bits.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Sequence

from ...schedule.generation import CANONICAL_SEQ
from ...schedule.transaction import KvOp, seq_clear, seq_compact, seq_keep, seq_rm


@dataclass
class SlotPrefix:
    tokens: tuple[int, ...] = ()   # the tokens whose cells sequence 0 keeps, from position 0
    used: int = 0                  # when the slot last took a request (least recent: lowest)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class PromptCache:
    def __init__(self, n_slots: int):
        self.slots = [SlotPrefix() for _ in range(n_slots)]
        self._clock = itertools.count(1)

    def pick(self, free: Sequence[int], prompt: Sequence[int], reuse: bool) -> tuple[int, int]:
        """(slot, prompt tokens whose cells it keeps) for a request: the free slot sharing
        the longest prefix (`reuse` False: none shared), ties to the least recently used."""
        def shared(slot: int) -> int:
            return common_prefix(self.slots[slot].tokens, prompt) if reuse else 0
        slot = max(free, key=lambda s: (shared(s), -self.slots[s].used))
        return slot, max(0, min(shared(slot), len(prompt) - 1))

    def take(self, slot: int, cached: int) -> list[KvOp]:
        """The slot starts a request reusing `cached` tokens: the KV operations (in the slot)
        removing its cells beyond them."""
        entry = self.slots[slot]
        kept, entry.tokens, entry.used = len(entry.tokens), (), next(self._clock)
        if cached == 0:
            return [seq_clear()] if kept else []
        return [seq_rm(CANONICAL_SEQ, cached, -1)] if cached < kept else []

    def release(self, slot: int, kept: Sequence[int]) -> list[KvOp]:
        """The slot's generation ended and its runs are back, with sequence 0 holding the
        cells of `kept` (prompt and accepted answer tokens, from position 0): the KV
        operations keeping those cells, and no other, at the front of the cache."""
        self.slots[slot].tokens = tuple(kept)
        if not kept:
            return [seq_clear()]
        return [seq_keep(CANONICAL_SEQ), seq_rm(CANONICAL_SEQ, len(kept), -1),
                seq_compact(CANONICAL_SEQ)]
