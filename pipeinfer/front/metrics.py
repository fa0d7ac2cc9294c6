"""The service's Prometheus metrics (GET /metrics), all of them, in a registry of their own.

The front counts what it sees: HTTP requests by endpoint and status, latencies as clients
see them (time to first token from a request's arrival, queueing and prefill included;
inter-token latency per gap between tokens, a recovery's pause included), restarts of the
job (and how many were for a job that hung: --stall-timeout), requests resumed on a new job
and how long recoveries took. The job counts what only it sees (serve/stats.py: tokens,
speculation, cancellations, requests waiting and running, each rank's busy seconds) and
sends its totals after every generation and when /metrics asks; the counters here add up
the last totals of every job the front has had."""

from __future__ import annotations

from prometheus_client import (CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram,
                               generate_latest)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

PREFIX = "pipeinfer_"
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
RECOVERY_BUCKETS = (1, 2, 5, 10, 15, 20, 30, 45, 60, 120, 300)

# The job's totals (serve/stats.JobStats), by metric name: (key, help).
JOB_COUNTERS = {
    "prompt_tokens": ("prompt_tokens", "Prompt tokens of the completions generated"),
    "prompt_tokens_cached": ("cached_tokens", "Prompt tokens whose KV cells were reused "
                             "from their slot (not evaluated)"),
    "completion_tokens": ("completion_tokens", "Tokens generated"),
    "requests_cancelled": ("cancelled", "Generations cancelled because their client went "
                           "away"),
    "drafted_tokens": ("drafted", "Tokens drafted for speculation"),
    "accepted_tokens": ("accepted", "Drafted tokens accepted"),
    "drafted_free_tokens": ("drafted_free", "Tokens a grammar forced (structured output), "
                            "given as drafts without a draft-model step"),
    "drafts_cut_tokens": ("drafts_cut", "Drafted tokens a grammar forbade, cut before being "
                          "sent"),
}


class ServiceMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self):
        self.registry = r = CollectorRegistry()
        self.requests = Counter(PREFIX + "requests", "HTTP requests answered, by endpoint "
                                "and status", ["endpoint", "status"], registry=r)
        self.restarts = Counter(PREFIX + "front_job_restarts", "Times the job ended "
                                "unexpectedly and was started again", registry=r)
        self.stalls = Counter(PREFIX + "front_job_stalls", "Times the job sent nothing for "
                              "--stall-timeout seconds with work under way and was killed "
                              "(counted in job_restarts too)", registry=r)
        self.resumed = Counter(PREFIX + "front_requests_resumed", "Requests sent again to a "
                               "new job, to go on from the tokens they had sent", registry=r)
        self.recovery = Histogram(PREFIX + "front_recovery_seconds", "From a job's failure "
                                  "noticed to the next job taking requests",
                                  buckets=RECOVERY_BUCKETS, registry=r)
        self.ttft = Histogram(PREFIX + "time_to_first_token_seconds", "From a request's "
                              "arrival to its first token", buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram(PREFIX + "inter_token_latency_seconds", "Between consecutive "
                             "tokens of a completion", buckets=LATENCY_BUCKETS, registry=r)
        self._jobs: dict[int, dict] = {}   # job number -> its last totals
        self._current = -1
        r.register(_JobCollector(self))

    def count(self, endpoint: str, status: int) -> None:
        """An HTTP request answered (http.build's `count`)."""
        self.requests.labels(endpoint=endpoint, status=str(status)).inc()

    def job_stats(self, job: int, totals: dict) -> None:
        """Job `job`'s totals since it started (its latest word on them)."""
        self._jobs[job] = totals
        self._current = max(self._current, job)

    def total(self, key: str) -> float:
        return float(sum(t.get(key, 0) for t in self._jobs.values()))

    def current(self) -> dict:
        """The totals of the latest job heard from ({} before any)."""
        return self._jobs.get(self._current, {})

    def render(self, job: tuple[int, dict] | None = None) -> bytes:
        """The text of /metrics, with the totals a job has just given (job number, totals)."""
        if job is not None:
            self.job_stats(*job)
        return generate_latest(self.registry)


class _JobCollector:
    """The job's totals as Prometheus families, read when /metrics is rendered."""

    def __init__(self, metrics: ServiceMetrics):
        self.metrics = metrics

    def collect(self):
        m = self.metrics
        for name, (key, text) in JOB_COUNTERS.items():
            yield CounterMetricFamily(PREFIX + name, text, value=m.total(key))
        yield CounterMetricFamily(PREFIX + "prompt_tokens_evaluated", "Prompt tokens evaluated",
                                  value=m.total("prompt_tokens") - m.total("cached_tokens"))
        now = m.current()
        yield GaugeMetricFamily(PREFIX + "queue_depth", "Requests waiting for the pipeline",
                                value=now.get("waiting", 0))
        yield GaugeMetricFamily(PREFIX + "requests_running", "Requests being generated",
                                value=now.get("running", 0))
        drafted, accepted = m.total("drafted"), m.total("accepted")
        yield GaugeMetricFamily(PREFIX + "acceptance_ratio", "Accepted over drafted tokens "
                                "since the start (0 before any draft)",
                                value=accepted / drafted if drafted else 0.0)
        busy = GaugeMetricFamily(PREFIX + "stage_busy_seconds", "Time each rank's stage "
                                 "spent computing since the job started (workers: as of the "
                                 "last probe, at most about a second old)", labels=["rank"])
        for rank, seconds in sorted(now.get("busy_s", {}).items()):
            busy.add_metric([str(rank)], seconds)
        yield busy
