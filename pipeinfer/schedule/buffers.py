"""Token buffers of PipeSpec's model hierarchy (pure): how a buffer follows a more trusted
one, and what it proposes after a context."""

from __future__ import annotations

from typing import Sequence


def extends(buffer: Sequence[int], prefix: Sequence[int]) -> bool:
    return len(buffer) >= len(prefix) and list(buffer[:len(prefix)]) == list(prefix)


def merge(lower: list[int], upper: list[int]) -> list[int]:
    """A buffer `lower` made to extend `upper` (a later, more trusted model's buffer): kept if
    it already does, else replaced by a copy of `upper` (rollback or catch-up)."""
    if extends(lower, upper):
        return lower
    return list(upper)


def proposal(buffer: list[int], context: Sequence[int], limit: int) -> list[int]:
    """The tokens of `buffer` continuing `context` (at most `limit`); none if it does not."""
    n = len(context)
    if limit <= 0 or len(buffer) <= n or not extends(buffer, context):
        return []
    return list(buffer[n:n + limit])
