"""The front's own Prometheus metrics (GET /metrics gives them, then the job's): HTTP
requests, restarts of the job (and how many of them were for a job that hung: --stall-timeout),
requests resumed on a new job, and how long recoveries took (from the failure noticed to the
new job taking requests)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

PREFIX = "pipeinfer_front_"
RECOVERY_BUCKETS = (1, 2, 5, 10, 15, 20, 30, 45, 60, 120, 300)


class FrontMetrics:
    def __init__(self):
        self.registry = r = CollectorRegistry()
        self.requests = Counter(PREFIX + "http_requests", "HTTP requests answered by the "
                                "front, by endpoint and status", ["endpoint", "status"],
                                registry=r)
        self.restarts = Counter(PREFIX + "job_restarts", "Times the job ended unexpectedly "
                                "and was started again", registry=r)
        self.stalls = Counter(PREFIX + "job_stalls", "Times the job sent nothing for "
                              "--stall-timeout seconds with work under way and was killed "
                              "(counted in job_restarts too)", registry=r)
        self.resumed = Counter(PREFIX + "requests_resumed", "Requests sent again to a new "
                               "job, to go on from the tokens they had sent", registry=r)
        self.recovery = Histogram(PREFIX + "recovery_seconds", "From a job's failure "
                                  "noticed to the next job taking requests",
                                  buckets=RECOVERY_BUCKETS, registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)
