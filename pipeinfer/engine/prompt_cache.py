"""The prompt prefixes the serving slots keep (`pipeinfer serve`'s prompt cache).

After a request, its slot keeps the KV cells of its prompt in sequence 0 on every rank; the
next request goes to the free slot whose kept prompt shares the longest prefix with its own
(ties: the least recently used), which then evaluates only the rest of its prompt (at least
its last token, whose row gives the first token), as llama-server does with cache_prompt.

Only the prompt's cells are kept, not the answer's: the prompt's cells sit at the start of
the cache in position order (a slot's prefill writes them contiguously after the kept ones),
whereas the answer's cells lie between those of rejected drafts. Freeing those leaves holes
that the next prefill would fill before later kept cells, and attention adds the cells up in
the cache's order: the results would differ in their last bits from llama.cpp keeping the
same prefix. So a greedy answer with a reused prefix equals llama.cpp's when it keeps that
prefix and evaluates the rest in the same batches; compared with a fresh evaluation of the
whole prompt (other batches), its logits may differ in their last bits.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Sequence

from ..schedule.generation import CANONICAL_SEQ
from ..schedule.transaction import KvOp, seq_clear, seq_keep, seq_rm


@dataclass
class SlotPrefix:
    tokens: tuple[int, ...] = ()   # the prompt whose cells sequence 0 keeps, from position 0
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

    def release(self, slot: int, prompt: Sequence[int], prefilled: bool) -> list[KvOp]:
        """The slot's generation ended and its runs are back: the KV operations keeping its
        prompt's cells (if its prefill completed on every rank) and no other."""
        if not prefilled:
            self.slots[slot].tokens = ()
            return [seq_clear()]
        self.slots[slot].tokens = tuple(prompt)
        return [seq_keep(CANONICAL_SEQ), seq_rm(CANONICAL_SEQ, len(prompt), -1)]
