"""A started job as the front shows it (its console and /api/status): every rank's role,
host, pid and layers, the bytes of weights it received at the start, its memory then and its
host's limit; the model's layers, the strategy, and what the planner predicted when
--layer-split auto planned the split. Plain data, sent once with the job's "ready"."""

from __future__ import annotations

from pathlib import Path

from .roles import Job

ROLES = ("head", "stage", "draft", "idle")   # idle: a rank the auto split left out


def layout(job: Job) -> dict:
    """The job's ranks (in rank order) and what they hold."""
    cfg = job.cfg
    n_pipeline = cfg.n_pipeline(job.link.size)
    ranges = list(job.ranges or [])
    ranks = [_rank(status, ranges, n_pipeline, cfg) for status in job.statuses]
    return {"ranks": ranks, "n_layer": ranges[-1].last if ranges else 0,
            "model": Path(str(cfg.model)).name, "strategy": cfg.strategy,
            "draft": Path(cfg.drafts[0]).name if cfg.uses_draft_model and cfg.drafts
            else None, "predicted": job.predicted}


def _rank(status, ranges, n_pipeline: int, cfg) -> dict:
    """One rank's entry from its status of the start (roles.Job.start's agree: rank, host,
    pid, error, bytes received, resident MB, its memory limit in MB)."""
    rank, host, pid, _, received, rss, limit = status[:7]
    held = ranges[rank] if rank < len(ranges) else None
    layers = [held.first, held.last] if held is not None and held.n_layer else None
    if rank >= n_pipeline:
        role = "draft"
    else:
        role = "head" if rank == 0 else "stage" if layers else "idle"
    entry = {"rank": rank, "host": host, "pid": pid, "role": role, "layers": layers,
             "received_bytes": int(received), "rss_mb": round(float(rss), 1),
             "memory_limit_mb": None if limit is None else round(float(limit), 1)}
    if role == "draft":
        entry["model"] = Path(cfg.drafts[rank - n_pipeline]).name
    return entry
