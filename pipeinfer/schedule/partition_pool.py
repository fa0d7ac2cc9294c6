"""KV cache multibuffering (paper IV-C): sequence-id partitions handed to speculative runs.

Sequence 0 is canonical (accepted tokens only). Sequence ids 1.. are cut into equal
partitions of `width` ids (one per tree branch); a speculative run takes the oldest free
partition and gives it back when its result has been absorbed or it was cancelled.

The last sequence id is the *graveyard*. A partition is cleared by moving its entries there
rather than deleting them, so their cells stay occupied: llama.cpp puts new tokens into the
lowest free cells, and refilling freed cells below newer ones would put a sequence's cells out
of position order. Attention sums over cells in cell order, so that would change results in
the last bits; with cells only ever taken in issue order, every visible cell of a sequence is
in position order, as in a plain single-sequence run, and logits stay bit-identical.
"""

from __future__ import annotations

from collections import deque


class PartitionPool:
    def __init__(self, n_partitions: int, width: int):
        if n_partitions < 1 or width < 1:
            raise ValueError("need at least one partition of at least one sequence")
        self.width = width
        self._free: deque[tuple[int, ...]] = deque(
            tuple(range(1 + i * width, 1 + (i + 1) * width)) for i in range(n_partitions))
        self.size = n_partitions

    @property
    def graveyard(self) -> int:
        return 1 + self.size * self.width

    @property
    def n_seq(self) -> int:
        """Sequence ids a context must allow (canonical and graveyard included)."""
        return 2 + self.size * self.width

    @property
    def n_free(self) -> int:
        return len(self._free)

    def take(self) -> tuple[int, ...] | None:
        return self._free.popleft() if self._free else None

    def give_back(self, partition: tuple[int, ...]) -> None:
        if partition in self._free:
            raise RuntimeError(f"partition {partition} returned twice")
        self._free.append(partition)

    @property
    def all_free(self) -> bool:
        return len(self._free) == self.size
