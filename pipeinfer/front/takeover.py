"""What the front tells a job it starts after a host was lost, so that the job can keep the
last one's layers where they were (job/takeover.py decides): the last job's layers per rank,
and which of its ranks run on the hosts the new job's ranks are placed on."""

from __future__ import annotations

from ..model.handover import KEPT_ENV, kept_env


def takeover_env(last: tuple[dict, list[str]] | None, now_placed: list[str]) -> dict:
    """{KEPT_ENV: ...} for a job placed on `now_placed` after the last job that was ready:
    `last` = (what it said when ready, its ranks' layers among it; the host of each of its
    ranks); {} when there is nothing to keep (none was ready, it had draft ranks, or a new
    rank's host was not in it)."""
    last_info, last_placed = last or ({}, [])
    ranks = last_info.get("ranks") or []
    if not ranks or len(ranks) != len(last_placed) or not now_placed:
        return {}
    if any(r.get("role") == "draft" for r in ranks):
        return {}
    layers = [tuple(r["layers"]) if r.get("layers") else (0, 0) for r in ranks]
    survivors, used = [], set()
    for host in now_placed:
        old = next((i for i, h in enumerate(last_placed) if h == host and i not in used), None)
        if old is None:
            return {}
        used.add(old)
        survivors.append(old)
    return {KEPT_ENV: kept_env(layers, survivors)}
