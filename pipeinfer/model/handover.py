"""Who takes over a lost stage's layers, decided before anything is lost, so that the ranks
that would take them over already hold copies of their cells (engine/worker/replicas.py sends them),
and a job started after the loss keeps every surviving stage's layers and cells.

A worker's layers [a, b) go to the workers beside it in the chain: the one before takes
[a, c), the one after [c, b), with c where the heavier of the two grown stages is lightest
(bytes of weights, the output's counted on the last stage: model/balance.py); a worker with
one neighbour holding layers gives it all of them. The head is never given layers (its core
drafts), and a lost head's node is not handed over (its successor would become the head).

After a failure, `kept_split` is that handover applied to the last job's split, and
`worth_keeping` says whether to use it: its heaviest stage at most KEPT_SLACK times the
heaviest of the balanced split a fresh start would use. The cells it keeps save evaluating
every request's context again, now, while every client waits; a heavier stage costs on
every token while the host is out (the front plans the split again when it answers).
"""

from __future__ import annotations

import json

from .partition import StageRange

KEPT_SLACK = 1.25
KEPT_ENV = "PIPEINFER_KEPT_SPLIT"   # the front to a job after a host was lost (kept_env)


def kept_env(layers: list[tuple[int, int]], survivors: list[int]) -> str:
    """What the front tells a job it starts after a host was lost: the last job's layers
    [first, last) per rank, and which of its ranks the new job's ranks are, in order."""
    return json.dumps({"ranges": [list(span) for span in layers], "survivors": survivors})


def stage_bytes(first: int, last: int, per_layer: list[int], final: int) -> int:
    """What a stage of layers [first, last) reads per token."""
    return sum(per_layer[first:last]) + (final if last == len(per_layer) and last > first
                                         else 0)


def handover(ranges: list[StageRange], lost: int, per_layer: list[int],
             final: int) -> list[tuple[int, int, int]]:
    """(rank, first, last) of each rank that takes over rank `lost`'s layers ([] for the
    head or a rank without layers, or when no worker beside it holds layers)."""
    held = [r for r in ranges[1:] if r.n_layer]
    if lost == 0 or ranges[lost].n_layer == 0:
        return []
    i = next(j for j, r in enumerate(held) if r.rank == lost)
    pred = held[i - 1] if i > 0 else None
    succ = held[i + 1] if i + 1 < len(held) else None
    a, b = ranges[lost].first, ranges[lost].last
    if pred is None and succ is None:
        return []
    if succ is None:
        cut = b
    elif pred is None:
        cut = a
    else:
        cut = min(range(a, b + 1), key=lambda c: max(
            stage_bytes(pred.first, c, per_layer, final),
            stage_bytes(c, succ.last, per_layer, final)))
    parts = []
    if pred is not None and cut > a:
        parts.append((pred.rank, a, cut))
    if succ is not None and b > cut:
        parts.append((succ.rank, cut, b))
    return parts


def replica_plan(ranges: list[StageRange], per_layer: list[int],
                 final: int) -> dict[int, list[tuple[int, int, int]]]:
    """For every worker: (rank, first, last) of the copies of its cells to send, each to the
    rank that would take those layers over."""
    return {r.rank: handover(ranges, r.rank, per_layer, final) for r in ranges[1:]}


def kept_split(old: list[StageRange], survivors: list[int], per_layer: list[int],
               final: int) -> list[tuple[int, int]] | None:
    """The layers [first, last) of each rank of a job on the `survivors` of the last one
    (its ranks, in the new job's rank order), every survivor keeping its own layers and the
    one lost worker's handed over (none lost: each keeps its layers); None when that is not
    how the job changed (the head's rank lost or moved, more than one rank lost, or a lost
    rank no neighbour took over)."""
    lost = [r.rank for r in old if r.rank not in survivors]
    if not survivors or survivors[0] != 0 or len(lost) > 1:
        return None
    if not lost:   # (relaunched on the same hosts while one is still out: as it was)
        return [(old[r].first, old[r].last) for r in survivors]
    parts = handover(old, lost[0], per_layer, final)
    if old[lost[0]].n_layer and not parts:
        return None
    layers = {r.rank: (r.first, r.last) for r in old}
    for rank, first, last in parts:
        mine = layers[rank]
        layers[rank] = (min(mine[0], first), max(mine[1], last))
    return [layers[r] for r in survivors]


def worth_keeping(kept: list[tuple[int, int]], balanced: list[StageRange],
                  per_layer: list[int], final: int) -> bool:
    """Whether the split that keeps cells is used instead of the balanced one."""
    def heaviest(spans) -> int:
        return max(stage_bytes(f, l, per_layer, final) for f, l in spans)
    return heaviest(kept) <= KEPT_SLACK * heaviest([(r.first, r.last) for r in balanced])
