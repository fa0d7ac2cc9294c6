"""What the job counts for the front's /metrics: totals since the job started (tokens,
speculation, cancellations), the requests waiting and running, and every rank's busy
seconds. Plain numbers, no Prometheus here: the front asks for a snapshot (a "metrics" call)
and keeps the totals of the jobs before this one (front/metrics.py)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Callable

# The counters of a generation (schedule/counters.Counters) the job adds up, by their name
# in the snapshot.
SPECULATION = {"drafted": "n_drafted", "accepted": "n_accepted",
               "drafted_free": "n_drafted_free", "drafts_cut": "n_drafts_cut"}


@dataclass
class JobStats:
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    cancelled: int = 0
    drafted: int = 0
    accepted: int = 0
    drafted_free: int = 0
    drafts_cut: int = 0
    busy_s: dict[int, float] = field(default_factory=dict)   # rank -> seconds computing

    def __post_init__(self):
        self.on_change: Callable[[], None] = lambda: None   # (not a field: not in snapshots)

    def generation(self, n_prompt: int, n_tokens: int, counters, cached: int = 0) -> None:
        """A generation ended (whatever way): its tokens (`cached` of the prompt reused) and
        speculation counters."""
        self.prompt_tokens += n_prompt
        self.cached_tokens += cached
        self.completion_tokens += n_tokens
        for name, attribute in SPECULATION.items():
            setattr(self, name, getattr(self, name) + getattr(counters, attribute))
        self.on_change()

    def snapshot(self, waiting: int, running: int) -> dict:
        """The totals with the requests waiting and running now (a "metrics" call's answer)."""
        totals = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "busy_s"}
        return {**totals, "busy_s": dict(self.busy_s), "waiting": waiting, "running": running}
