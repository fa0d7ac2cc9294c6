"""The default layer split: pipeline stages of equal weight, the output head counted.

A stage's time per token is about the bytes of weights it reads. Layers of one model weigh
alike, but the last stage also holds the output matrix: Qwen2.5-Coder 1.5B's (151,936 x 1,536)
weighs about five of its 28 layers, so an even split of layers gives the last stage about twice
the work of the others, and that stage paces every pipelined run. The balanced split gives the
last stage fewer layers so that the heaviest stage is as light as it can be (an exact search over
contiguous splits), and the other stages share the rest evenly.
"""

from __future__ import annotations

import re
from functools import lru_cache

from .gguf_header import Header

_BLOCK = re.compile(r"blk\.(\d+)\.")
OUTPUT_TENSORS = ("output.weight", "output_norm.weight")


def layer_bytes(header: Header, n_layer: int) -> tuple[list[int], int]:
    """Bytes of weights per layer, and those only the last stage reads (output norm and
    matrix; the token embedding when the output is tied to it)."""
    per_layer = [0] * n_layer
    for tensor in header.tensors.values():
        found = _BLOCK.match(tensor.name)
        if found and int(found.group(1)) < n_layer:
            per_layer[int(found.group(1))] += tensor.n_bytes
    names = list(OUTPUT_TENSORS)
    if "output.weight" not in header.tensors:  # tied: the output reads the token embedding
        names.append("token_embd.weight")
    final = sum(header.tensors[n].n_bytes for n in names if n in header.tensors)
    return per_layer, final


def balanced_counts(per_layer: list[int], final: int, n_stages: int) -> list[int]:
    """Layers per stage (each at least one), contiguous: the heaviest stage (the last one's
    bytes include `final`) as light as it can be, and among such splits the most even one
    (least sum of squared stage bytes; ties: earlier stages fewer layers)."""
    n = len(per_layer)
    if not 1 <= n_stages <= n:
        raise ValueError(f"cannot split {n} layers over {n_stages} stages")
    prefix = [0]
    for b in per_layer:
        prefix.append(prefix[-1] + b)

    def load(start: int, end: int) -> int:
        return prefix[end] - prefix[start] + (final if end == n else 0)

    @lru_cache(maxsize=None)
    def bottleneck(start: int, stages: int) -> int:
        if stages == 1:
            return load(start, n)
        return min(max(load(start, end), bottleneck(end, stages - 1))
                   for end in range(start + 1, n - stages + 2))

    limit = bottleneck(0, n_stages)

    @lru_cache(maxsize=None)
    def evenest(start: int, stages: int) -> tuple[float, tuple[int, ...]]:
        # (sum of squared loads, counts) of layers [start, n) with every stage within limit
        if stages == 1:
            own = load(start, n)
            return (own * own if own <= limit else float("inf")), (n - start,)
        options = []
        for end in range(start + 1, n - stages + 2):
            own = load(start, end)
            if own <= limit:
                rest, counts = evenest(end, stages - 1)
                options.append((own * own + rest, (end - start, *counts)))
        return min(options, default=(float("inf"), ()))

    return list(evenest(0, n_stages)[1])


def balanced_split(header: Header, n_layer: int, n_ranks: int, head_layers: bool) -> list[float]:
    """Fractions for `partition` that reproduce the balanced counts exactly; rank 0 gets none
    when `head_layers` is False (it drafts instead)."""
    per_layer, final = layer_bytes(header, n_layer)
    stages = n_ranks if head_layers else n_ranks - 1
    counts = balanced_counts(per_layer, final, stages)
    fractions = [c / n_layer for c in counts]
    return fractions if head_layers else [0.0] + fractions
