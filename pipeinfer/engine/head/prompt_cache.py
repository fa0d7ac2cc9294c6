"""The conversations the serving slots keep (`pipeinfer serve`'s prompt cache), exact by
default: a reused prefix never changes an answer.

After a request, its slot keeps the KV cells of its prompt and of its answer (the accepted
tokens whose cells sequence 0 holds: all but the last, which was never evaluated) in
sequence 0 on every rank; the next request goes to the free slot whose kept tokens share the
longest usable prefix with its prompt (ties: the least recently used), which then evaluates
only the rest of its prompt (at least its last token, whose row gives the first token).

Which kept cells are usable, exactly: llama.cpp computes a token's cells (and the logits
after them) with kernels chosen by the batch's size, so a cell is the same bits as a fresh
evaluation's only if it was computed in the same batch as a fresh evaluation of the new
prompt computes it. A prompt is evaluated in chunks of the job's chunk size from the first
token it does not reuse, so where nothing is reused the chunks' bounds are multiples of the
chunk size, and the cells of every whole chunk of an earlier prompt are the same bits a fresh
evaluation of any prompt starting with those tokens produces; the cells of a partial last
chunk and of an answer (computed in decode runs) are not. EXACT keeps the common prefix cut
down to the last whole chunk that an earlier prompt computed that way; the rest is then
evaluated in the chunks a fresh evaluation uses. LLAMA_SERVER keeps the whole common prefix
and evaluates the rest in chunks from there, as llama-server does: the answer equals
llama.cpp's doing the same, which may differ from a fresh evaluation's (`--cache-prompt
llama-server`). OFF keeps nothing.

Speculative runs leave nothing in the kept cells: only sequence 0 stays, whose cells hold
accepted tokens only (schedule/speculation.py), and rejected drafts' cells go with their
sequences. They leave holes between the answer's cells, though (a generation never reuses a
cell: partition_pool), and a later batch would fill the holes before going after the kept
cells: attention would add the cells up in another order than llama.cpp alone does. So the
slot's cells are compacted (transaction.seq_compact): moved, bits and order unchanged, to
the front of the cache, where a cache that held nothing else has them.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Sequence

from ...config.serving import LLAMA_SERVER, OFF
from ...schedule.generation import CANONICAL_SEQ
from ...schedule.transaction import KvOp, seq_clear, seq_compact, seq_keep, seq_rm


RESERVED = 1 << 62   # a reserved slot's `used`: the least recently used of all last


@dataclass
class SlotPrefix:
    tokens: tuple[int, ...] = ()   # the tokens whose cells sequence 0 keeps, from position 0
    exact: int = 0                 # how many of them have a fresh evaluation's cells
    used: int = 0                  # when the slot last took a request (least recent: lowest)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class PromptCache:
    def __init__(self, n_slots: int, chunk: int):
        self.slots = [SlotPrefix() for _ in range(n_slots)]
        self.chunk = chunk   # the prompt's batches end at its multiples
        self._clock = itertools.count(1)
        self._base: dict[int, int] = {}   # slot -> exact cells it kept for its request

    def usable(self, slot: int, prompt: Sequence[int], mode: str) -> int:
        """How many of `prompt`'s leading tokens `slot`'s kept cells spare, under `mode`
        (never the last token: its row gives the first token)."""
        if mode == OFF:
            return 0
        entry = self.slots[slot]
        shared = min(common_prefix(entry.tokens, prompt), len(prompt) - 1)
        if mode == LLAMA_SERVER:
            return max(0, shared)
        return max(0, min(shared, entry.exact)) // self.chunk * self.chunk

    def pick(self, free: Sequence[int], prompt: Sequence[int], mode: str) -> tuple[int, int]:
        """(slot, prompt tokens whose cells it keeps) for a request: the free slot with the
        most usable cells, ties to the least recently used."""
        slot = max(free, key=lambda s: (self.usable(s, prompt, mode), -self.slots[s].used))
        return slot, self.usable(slot, prompt, mode)

    def take(self, slot: int, cached: int) -> list[KvOp]:
        """The slot starts a request reusing `cached` tokens: the KV operations (in the slot)
        removing its cells beyond them."""
        entry = self.slots[slot]
        kept, entry.tokens, entry.used = len(entry.tokens), (), next(self._clock)
        self._base[slot] = min(cached, entry.exact)   # (exact cells among those reused)
        entry.exact = 0
        if cached == 0:
            return [seq_clear()] if kept else []
        return [seq_rm(CANONICAL_SEQ, cached, -1)] if cached < kept else []

    def resume(self, slot: int, cached: int, n_prompt: int) -> list[KvOp]:
        """The slot holds cells a failed job's ranks kept of a request now resumed there
        (engine/head/kept.py), which reuses `cached` positions of them: the KV operations
        removing the rest (every rank may hold a different number)."""
        entry = self.slots[slot]
        entry.tokens, entry.exact, entry.used = (), 0, next(self._clock)
        self._base[slot] = min(cached, n_prompt // self.chunk * self.chunk)
        return [seq_rm(CANONICAL_SEQ, cached, -1)] if cached else [seq_clear()]

    def reserve(self, slot: int, tokens) -> None:
        """`slot` holds cells taken back for a request that has not come again yet: a new
        request takes it only when no other slot is free."""
        self.slots[slot] = SlotPrefix(tuple(tokens), 0, RESERVED)

    def release(self, slot: int, kept: Sequence[int], n_prompt: int, cached: int) -> list[KvOp]:
        """The slot's request, whose prompt had `n_prompt` tokens (`cached` of them reused),
        ended and its runs are back, with sequence 0 holding the cells of `kept` (prompt and
        accepted answer tokens, from position 0): the KV operations keeping those cells, and
        no other, at the front of the cache."""
        entry = self.slots[slot]
        entry.tokens = tuple(kept)
        entry.exact = min(self.exact_after(self._base.pop(slot, 0), cached, n_prompt),
                          len(kept))
        if not kept:
            return [seq_clear()]
        return [seq_keep(CANONICAL_SEQ), seq_rm(CANONICAL_SEQ, len(kept), -1),
                seq_compact(CANONICAL_SEQ)]

    def exact_start(self, slot: int, cached: int, n_prompt: int) -> int:
        """The cells with a fresh evaluation's bits `slot` will hold once the prompt of the
        request it just took (take) went in (exact_after)."""
        return self.exact_after(self._base.get(slot, 0), cached, n_prompt)

    def took_back(self, slot: int, tokens: Sequence[int]) -> None:
        """`slot`'s cells are now those of `tokens`, every one a fresh evaluation's: taken
        back from its refill context (refill.AlongRefill)."""
        entry = self.slots[slot]
        entry.tokens, entry.exact = tuple(tokens), len(tokens)

    def refill_span(self, slot: int) -> tuple[int, int]:
        """(start, stop): the whole chunks of what `slot` keeps past its exact cells, which
        a refill may evaluate again as prompt (refill.py)."""
        entry = self.slots[slot]
        return entry.exact, len(entry.tokens) // self.chunk * self.chunk

    def refilled(self, slot: int, exact: int) -> None:
        """`slot`'s refill is over with its first `exact` cells a fresh evaluation's; the
        cells after them are gone."""
        entry = self.slots[slot]
        entry.tokens, entry.exact = entry.tokens[:exact], exact

    def exact_after(self, base: int, cached: int, n_prompt: int) -> int:
        """The cells with a fresh evaluation's bits after a request's prompt went in: its
        whole chunks, if the prefix it reused (`cached`) was exact and ended on a chunk's
        bound (so its own chunks lie where a fresh evaluation's do); else only the exact
        whole chunks of that prefix."""
        c = self.chunk
        if base == cached and cached % c == 0:
            return n_prompt // c * c
        return base // c * c
