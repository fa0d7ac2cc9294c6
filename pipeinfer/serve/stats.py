"""What the job counts for the front's /metrics and console: totals since the job started
(tokens, speculation by source, runs started and cancelled, cancellations), the requests
waiting and running, and every rank's busy and CPU seconds and resident memory (the busy
probe's, serve/loop.py). Plain numbers, no Prometheus here: the front asks for a snapshot (a
"metrics" call) and keeps the totals of the jobs before this one (front/metrics.py); the
head's pulse (pulse.py) adds the generations under way to them."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Callable

# The counters of a generation (schedule/counters.Counters) the job adds up, by their name
# in the snapshot.
SPECULATION = {"drafted": "n_drafted", "accepted": "n_accepted",
               "drafted_ngram": "n_drafted_ngram", "accepted_ngram": "n_accepted_ngram",
               "drafted_free": "n_drafted_free", "drafts_cut": "n_drafts_cut",
               "runs_started": "runs_started",
               "runs_cancelled": ("runs_cancelled_superfluous", "runs_cancelled_invalidated"),
               "runs_aborted": "runs_aborted_midway"}
PER_RANK = ("busy_s", "cpu_s", "rss_mb")   # rank -> value, as of the last busy probe


def speculation(counters) -> dict[str, int]:
    """A generation's counters (schedule/counters.Counters) by their names here."""
    return {name: sum(getattr(counters, a) for a in (
        (attribute,) if isinstance(attribute, str) else attribute))
        for name, attribute in SPECULATION.items()}


@dataclass
class JobStats:
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    cancelled: int = 0
    drafted: int = 0
    accepted: int = 0
    drafted_ngram: int = 0
    accepted_ngram: int = 0
    drafted_free: int = 0
    drafts_cut: int = 0
    runs_started: int = 0
    runs_cancelled: int = 0
    runs_aborted: int = 0
    busy_s: dict[int, float] = field(default_factory=dict)   # rank -> seconds computing
    cpu_s: dict[int, float] = field(default_factory=dict)    # rank -> CPU seconds
    rss_mb: dict[int, float] = field(default_factory=dict)   # rank -> resident MB

    def __post_init__(self):
        # (not fields: not in snapshots) a generation ended; the head's pulse (pulse.py)
        self.on_change: Callable[[], None] = lambda: None
        self.on_pulse: Callable[[dict], None] = lambda pulse: None

    def generation(self, n_prompt: int, n_tokens: int, counters, cached: int = 0) -> None:
        """A generation ended (whatever way): its tokens (`cached` of the prompt reused) and
        speculation counters."""
        self.prompt_tokens += n_prompt
        self.cached_tokens += cached
        self.completion_tokens += n_tokens
        for name, value in speculation(counters).items():
            setattr(self, name, getattr(self, name) + value)
        self.on_change()

    def snapshot(self, waiting: int, running: int) -> dict:
        """The totals with the requests waiting and running now (a "metrics" call's answer)."""
        totals = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in PER_RANK}
        return {**totals, **{name: dict(getattr(self, name)) for name in PER_RANK},
                "waiting": waiting, "running": running}


def answer_timings(gen, n_prompt: int, cached: int) -> dict:
    """An answer's figures for its client, as llama-server's `timings` names them (prompt_n,
    prompt_ms, predicted_n, predicted_ms, predicted_per_second, draft_n, draft_n_accepted),
    with the drafts by source (`drafts`: model, ngram, grammar): what this job generated of
    it (a resumed answer's earlier part was another job's)."""
    t, c = gen.timeline, speculation(gen.counters)
    predicted_n = len(t.accepted)
    return {"prompt_n": n_prompt - cached, "prompt_ms": round(1e3 * max(t.prefill_s, 0), 3),
            "predicted_n": predicted_n, "predicted_ms": round(1e3 * t.gen_s, 3),
            "predicted_per_second": round(t.speed_tps, 3) if t.speed_tps else None,
            "draft_n": c["drafted"], "draft_n_accepted": c["accepted"],
            "drafts": {"model": {"drafted": c["drafted"] - c["drafted_ngram"],
                                 "accepted": c["accepted"] - c["accepted_ngram"]},
                       "ngram": {"drafted": c["drafted_ngram"], "accepted": c["accepted_ngram"]},
                       "grammar": {"forced": c["drafted_free"], "cut": c["drafts_cut"]}}}
