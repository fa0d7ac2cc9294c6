"""The split of a job a front started after one of its hosts was lost: the front names the
last job's split and which of its ranks the new job's are (KEPT_ENV); if every surviving
rank can keep its layers, the lost worker's handed to its neighbours (model/handover.py),
and that split is worth it against the balanced one, the job uses it, so that the cells
every rank kept, and the copies its neighbours hold of the lost one's, are taken back
(job/restore.py) instead of every request being evaluated again."""

from __future__ import annotations

import json
import logging
import os

from ..model.balance import layer_bytes
from ..model.handover import KEPT_ENV, kept_split, worth_keeping
from ..model.partition import PartitionError, StageRange, partition

log = logging.getLogger(__name__)


def takeover_fractions(header, n_layer: int, balanced: list[float],
                       environ=os.environ) -> list[float] | None:
    """The fractions of the split that keeps the last job's layers where they were, or None
    (no such split, or not worth it: the balanced split is used, and the log says why)."""
    text = environ.get(KEPT_ENV, "")
    if not text:
        return None
    try:
        named = json.loads(text)
        old = [StageRange(r, f, l, False) for r, (f, l) in enumerate(named["ranges"])]
        survivors = [int(r) for r in named["survivors"]]
    except (ValueError, KeyError, TypeError):
        log.warning("%s is not a split the front writes: ignored", KEPT_ENV)
        return None
    if not old or old[-1].last != n_layer or len(survivors) != len(balanced):
        return None
    per_layer, final = layer_bytes(header, n_layer)
    kept = kept_split(old, survivors, per_layer, final)
    why = ""
    if kept is None:
        why = "the head's rank was lost, or more than one, or no neighbour holds a copy"
    elif balanced[0] == 0 and kept[0][1] > kept[0][0]:
        why, kept = "it would give the head layers", None
    if kept is not None:
        fractions = [(last - first) / n_layer for first, last in kept]
        try:
            ranges = partition(n_layer, fractions, allow_empty=True)
        except PartitionError as err:
            ranges, why = [], str(err)
        balanced_ranges = partition(n_layer, balanced, allow_empty=True)
        if [(r.first, r.last) for r in ranges] != kept:
            why = why or "its fractions do not give those layers"
        elif not worth_keeping(kept, balanced_ranges, per_layer, final):
            why = "its heaviest stage would be much heavier than the balanced split's"
        else:
            log.info("split after a lost host: every surviving rank keeps its layers: %s",
                     ", ".join(f"[{f},{l})" for f, l in kept))
            return fractions
    log.info("split after a lost host: balanced, every request evaluated again (%s)", why)
    return None
