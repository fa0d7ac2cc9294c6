"""The server's Prometheus metrics (GET /metrics), in a registry of their own.

Latencies are what a client sees: time to first token from the request's arrival (queueing
and prefill included), inter-token latency per gap between tokens."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
PREFIX = "pipeinfer_"


class ServeMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self):
        self.registry = r = CollectorRegistry()
        self.requests = Counter(PREFIX + "requests", "HTTP requests answered, by endpoint "
                                "and status", ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter(PREFIX + "prompt_tokens", "Prompt tokens of the "
                                     "completions generated", registry=r)
        self.cached_tokens = Counter(PREFIX + "prompt_tokens_cached", "Prompt tokens whose "
                                     "KV cells were reused from their slot (not evaluated)",
                                     registry=r)
        self.evaluated_tokens = Counter(PREFIX + "prompt_tokens_evaluated", "Prompt tokens "
                                        "evaluated", registry=r)
        self.completion_tokens = Counter(PREFIX + "completion_tokens", "Tokens generated",
                                         registry=r)
        self.cancelled = Counter(PREFIX + "requests_cancelled", "Generations cancelled "
                                 "because their client went away", registry=r)
        self.drafted = Counter(PREFIX + "drafted_tokens", "Tokens drafted for speculation",
                               registry=r)
        self.accepted = Counter(PREFIX + "accepted_tokens", "Drafted tokens accepted",
                                registry=r)
        self.drafted_free = Counter(PREFIX + "drafted_free_tokens", "Tokens a grammar "
                                    "forced (structured output), given as drafts without a "
                                    "draft-model step", registry=r)
        self.drafts_cut = Counter(PREFIX + "drafts_cut_tokens", "Drafted tokens a grammar "
                                  "forbade, cut before being sent", registry=r)
        self.queue_depth = Gauge(PREFIX + "queue_depth", "Requests waiting for the pipeline",
                                 registry=r)
        self.running = Gauge(PREFIX + "requests_running", "Requests being generated",
                             registry=r)
        self.acceptance = Gauge(PREFIX + "acceptance_ratio", "Accepted over drafted tokens "
                                "since the start (0 before any draft)", registry=r)
        self.busy = Gauge(PREFIX + "stage_busy_seconds", "Time each rank's stage spent "
                          "computing since the start (workers: as of the last probe, at most "
                          "about a second old)", ["rank"], registry=r)
        self._totals = [0, 0]     # drafted, accepted
        self.ttft = Histogram(PREFIX + "time_to_first_token_seconds", "From a request's "
                              "arrival to its first token", buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram(PREFIX + "inter_token_latency_seconds", "Between consecutive "
                             "tokens of a completion", buckets=LATENCY_BUCKETS, registry=r)

    def generation(self, n_prompt: int, n_tokens: int, counters, cached: int = 0) -> None:
        """A generation ended (whatever way): its tokens (`cached` of the prompt reused) and
        speculation counters."""
        self.prompt_tokens.inc(n_prompt)
        self.cached_tokens.inc(cached)
        self.evaluated_tokens.inc(n_prompt - cached)
        self.completion_tokens.inc(n_tokens)
        self.drafted.inc(counters.n_drafted)
        self.accepted.inc(counters.n_accepted)
        self.drafted_free.inc(counters.n_drafted_free)
        self.drafts_cut.inc(counters.n_drafts_cut)
        self._totals[0] += counters.n_drafted
        self._totals[1] += counters.n_accepted
        drafted, accepted = self._totals
        self.acceptance.set(accepted / drafted if drafted else 0.0)

    def stage_busy(self, rank: int, seconds: float) -> None:
        self.busy.labels(rank=str(rank)).set(seconds)

    def render(self, queue_depth: int, running: int, busy_s: float | None) -> bytes:
        self.queue_depth.set(queue_depth)
        self.running.set(running)
        if busy_s is not None:
            self.busy.labels(rank="0").set(busy_s)
        return generate_latest(self.registry)
