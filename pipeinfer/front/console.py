"""What the web console shows (GET /api/status, GET /api/events), kept by the front on its
event loop from what it sees anyway:

- the job's pulse (serve/pulse.py: once a second while the job works, nothing while it is
  idle) becomes a sample: each rank's busy fraction and CPU over the last second, its
  memory, runs in flight, started, cancelled and accepted per second, drafts by source;
- the request table's token arrivals (table.py) give each request's tokens per second, the
  total, and the times to first token and between tokens of that second;
- the job's keeper says when the service's state changes (ok, recovering, waiting, ...) and
  what its job holds once ready (job/layout.py, in the keeper's `info`); its history (each
  job's start, readiness and end with the reason, hosts left and back, recoveries, requests
  resumed) comes through trace.py's records.

Samples are kept for the last RING samples, the history for its last HISTORY events; every
event is encoded once and put on each watcher's queue (its server-sent events): a watcher
costs the front a queue, and the head nothing."""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque

RING = 120          # samples kept (about two minutes of work)
HISTORY = 100       # job history events kept
TTFT_KEPT = 200     # times to first token kept for the distribution
ITL_BUCKETS_MS = (5, 10, 25, 50, 100, 250, 500, 1000)   # upper bounds; the last bucket: more
WATCHER_QUEUE = 64  # events a watcher may have unread before it is sent the status again
KEEPALIVE_S = 15.0  # a comment to a quiet watcher this often (a gone one is then noticed)
RATES = ("runs_started", "runs_cancelled", "runs_aborted", "drafted", "accepted",
         "drafted_ngram", "accepted_ngram", "drafted_free", "drafts_cut")


class Console:
    def __init__(self, model_name: str):
        self.model_name = model_name
        self.keeper = None          # the job's keeper (supervisor.py, in_job.py), once made
        self.samples: deque[dict] = deque(maxlen=RING)
        self.history: deque[dict] = deque(maxlen=HISTORY)
        self.ttft: deque[float] = deque(maxlen=TTFT_KEPT)
        self.itl = [0] * (len(ITL_BUCKETS_MS) + 1)
        self.watchers: set[asyncio.Queue] = set()
        self._pulse: tuple[int, dict] | None = None   # (job, its last pulse)
        self._tokens: dict[int, int] = {}   # rid -> tokens since the last sample
        self._ttft_new: list[float] = []
        self._itl_new = [0] * len(self.itl)

    # --- what the front sees -------------------------------------------------------------
    def token(self, rid: int, seconds: float, first: bool) -> None:
        """A token of request `rid` arrived, `seconds` after the request (its first) or
        after its previous token."""
        self._tokens[rid] = self._tokens.get(rid, 0) + 1
        if first:
            self._ttft_new.append(round(seconds, 4))
        else:
            self._itl_new[_bucket(seconds)] += 1

    def pulse(self, job: int, pulse: dict) -> None:
        """The job's pulse: a sample, from what moved since its pulse before."""
        before = self._pulse[1] if self._pulse and self._pulse[0] == job else None
        self._pulse = (job, pulse)
        if before is None:
            return   # (its first: nothing to measure from yet)
        sample = self._sample(job, before, pulse)
        self.samples.append(sample)
        self._publish("sample", sample)

    def _sample(self, job: int, before: dict, now: dict) -> dict:
        """Rates over the pulse's span: busy seconds and counters moved only since the probe
        before it (else a pulse would have gone then), CPU over the whole gap."""
        span = max(now.get("span", 1.0), 1e-3)
        gap = max(now["at"] - before["at"], 1e-3)
        busy = {r: _fraction(s - before["busy_s"].get(r, s), span)
                for r, s in now["busy_s"].items()}
        cpu = {r: round(max(s - before["cpu_s"].get(r, s), 0.0) / gap, 3)
               for r, s in now["cpu_s"].items()}
        rates = {k: round((now["totals"].get(k, 0) - before["totals"].get(k, 0)) / span, 3)
                 for k in RATES}
        requests = {rid: round(n / span, 2) for rid, n in self._tokens.items()}
        sample = {"t": round(time.time(), 3), "job": job, "span": round(span, 3),
                  "busy": busy, "cpu": cpu, "rss_mb": {r: round(v, 1) for r, v in
                                                       now["rss_mb"].items()},
                  "in_flight": now["in_flight"], "running": now["running"],
                  "waiting": now["waiting"], "rates": rates, "totals": now["totals"],
                  "requests": requests, "tokens_per_s": round(sum(requests.values()), 2),
                  "ttft": self._ttft_new, "itl": self._itl_new}
        self.ttft.extend(self._ttft_new)
        self.itl = [a + b for a, b in zip(self.itl, self._itl_new)]
        self._tokens, self._ttft_new, self._itl_new = {}, [], [0] * len(self.itl)
        return sample

    def record(self, name: str, fields: dict) -> None:
        """An event of the jobs' history (trace.py's records); a job ready brings its
        layout (what each rank holds) to every watcher."""
        entry = {"time": round(time.time(), 3), "name": name, **fields}
        if name == "job_ready" and self.keeper is not None:
            info = self.keeper.info
            entry["split"] = [[r["rank"], *(r["layers"] or [0, 0])]
                              for r in info.get("ranks", [])]
            self._publish("job", self.cluster())
        self.history.append(entry)
        self._publish("history", entry)

    def state_changed(self) -> None:
        """The keeper's state or reason changed."""
        self._publish("state", self.service())

    # --- what it shows ---------------------------------------------------------------------
    def service(self) -> dict:
        keeper = self.keeper
        if keeper is None:
            return {"state": "loading", "reason": "", "job": 0}
        return {"state": keeper.state, "reason": keeper.reason, "job": keeper.number}

    def cluster(self) -> dict:
        """The job's layout (job/layout.py) as its keeper got it; {} before any job is up."""
        info = dict(self.keeper.info) if self.keeper is not None else {}
        info.pop("statuses", None)
        return info

    def status(self) -> dict:
        """Everything at once: /api/status, and a watcher's first event."""
        return {"model": self.model_name, "service": self.service(),
                "cluster": self.cluster(), "samples": list(self.samples),
                "history": list(self.history),
                "latency": {"ttft_s": list(self.ttft), "itl_buckets_ms": ITL_BUCKETS_MS,
                            "itl_counts": self.itl}}

    # --- the watchers ----------------------------------------------------------------------
    def _publish(self, kind: str, data: dict) -> None:
        if not self.watchers:
            return
        text = sse(kind, data)
        for queue in self.watchers:
            if queue.full():   # a watcher that does not keep up starts again from the status
                while not queue.empty():
                    queue.get_nowait()
                queue.put_nowait(sse("status", self.status()))
            else:
                queue.put_nowait(text)

    async def events(self):
        """A watcher's server-sent events: the status, then every event as it happens (a
        comment every KEEPALIVE_S while none does)."""
        queue: asyncio.Queue = asyncio.Queue(WATCHER_QUEUE)
        self.watchers.add(queue)
        try:
            yield sse("status", self.status())
            while True:
                try:
                    yield await asyncio.wait_for(queue.get(), KEEPALIVE_S)
                except asyncio.TimeoutError:
                    yield ": quiet\n\n"
        finally:
            self.watchers.discard(queue)


def sse(kind: str, data: dict) -> str:
    return f"event: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


def _fraction(seconds: float, span: float) -> float:
    return round(min(max(seconds / span, 0.0), 1.0), 3)


def _bucket(seconds: float) -> int:
    ms = seconds * 1e3
    for i, bound in enumerate(ITL_BUCKETS_MS):
        if ms <= bound:
            return i
    return len(ITL_BUCKETS_MS)
