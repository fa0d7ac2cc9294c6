"""Partitioning a model's layers over pipeline ranks.

A layer split is one fraction per rank, in rank order. Rank r owns the contiguous layers
[boundary(r), boundary(r+1)) where boundary(i) = round(n_layer * (F0 + ... + F(i-1))), rounding
halves up. Rounding the cumulative sums (not each share) keeps the total exact and every error
under half a layer. Only rank 0 (the head) may own no layers: it then only drafts and samples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SUM_TOLERANCE = 1e-6


class PartitionError(ValueError):
    """A layer split that cannot be applied; the message says why."""


@dataclass(frozen=True)
class StageRange:
    """The layers [first, last) of the target model that one rank evaluates."""

    rank: int
    first: int
    last: int
    final: bool  # produces logits (the last rank)

    @property
    def n_layer(self) -> int:
        return self.last - self.first

    def __str__(self) -> str:
        return f"rank {self.rank}: layers [{self.first}, {self.last})" + (" final" if self.final else "")


def parse_split(text: str) -> list[float]:
    """Parse "0.1,0.3,0.6" into fractions, refusing malformed and negative values."""
    if "/" in text:
        raise PartitionError(f"layer split {text!r}: '/' (draft models on ranks of their own) "
                             "applies to `pipeinfer run --strategy pipespec` only")
    try:
        fractions = [float(part) for part in text.split(",")]
    except ValueError:
        raise PartitionError(f"layer split {text!r} is not a comma-separated list of numbers") from None
    for value in fractions:
        if not math.isfinite(value) or value < 0:
            raise PartitionError(f"layer split {text!r}: fractions must be finite and non-negative")
    return fractions


def parse_layer_split(text: str) -> tuple[list[float], int]:
    """Parse `pipeinfer run`'s split: the target's fractions, then one "/1" per draft model on
    a rank of its own (PipeSpec's hierarchy; a draft model is not split further), e.g.
    "0,0.5,0.5/1/1": ranks 0-2 hold the target, ranks 3 and 4 the draft models M0 and M1.
    Returns the target's fractions and the number of draft ranks."""
    target, *drafts = text.split("/")
    for group in drafts:
        try:
            whole = float(group) == 1.0
        except ValueError:
            whole = False
        if not whole:
            raise PartitionError(
                f"layer split {text!r}: after '/' give 1 per draft model on a rank of its own "
                "(draft models are not split over ranks), e.g. 0,0.5,0.5/1/1")
    return parse_split(target), len(drafts)


def partition(n_layer: int, fractions: list[float], allow_empty: bool = False
              ) -> list[StageRange]:
    """Turn per-rank fractions into per-rank layer ranges (see the module docstring).
    `allow_empty`: ranks after the head may get no layers too (`--layer-split auto` leaves
    nodes that would only slow the pipeline out of the chain); the last rank with layers is
    then the final one."""
    if not fractions:
        raise PartitionError("layer split is empty")
    if any(f < 0 for f in fractions):
        raise PartitionError("layer split fractions must be non-negative")
    total = sum(fractions)
    if abs(total - 1.0) > SUM_TOLERANCE:
        raise PartitionError(f"layer split fractions sum to {total:.9g}, not 1")
    if not allow_empty and (len(fractions) > n_layer + 1
                            or (len(fractions) > n_layer and fractions[0] > 0)):
        raise PartitionError(
            f"{len(fractions)} ranks but the model has only {n_layer} layers: "
            "every rank after the head needs at least one layer")
    cumulative = [0.0]
    for f in fractions:
        cumulative.append(cumulative[-1] + f)
    # halves round up also when float error puts a decimal half (0.55 * 10) just below .5
    bounds = [math.floor(n_layer * c / total + 0.5 + 1e-9) for c in cumulative]
    bounds[-1] = n_layer
    last = max(r for r in range(len(fractions)) if bounds[r + 1] > bounds[r])
    ranges = [StageRange(r, bounds[r], bounds[r + 1], r == last)
              for r in range(len(fractions))]
    for stage in ranges[1:] if not allow_empty else ():
        if stage.n_layer == 0:
            raise PartitionError(
                f"layer split {format_split(fractions)} gives rank {stage.rank} no layers of "
                f"{n_layer}; only rank 0 (the head) may hold none")
    return ranges


def chain(ranges: list[StageRange]) -> list[int]:
    """The ranks activations pass through, in order: the head and every rank with layers."""
    return [0] + [r.rank for r in ranges[1:] if r.n_layer > 0]


def format_split(fractions: list[float]) -> str:
    return ",".join(f"{f:g}" for f in fractions)
