"""What the head measures once a second, on its own thread: every worker's busy and CPU
seconds and resident memory (a busy probe through the pipeline: BusyProbe), and then the
job's pulse to the front (Pulse): those figures with the head's own, the runs in flight, the
requests waiting and running, and the totals of stats.py with the generations under way
added, as one small message:

    job -> front   ("pulse", {"at": the head's time.monotonic(), "span": s since the
                   probe before, "busy_s": {rank: s}, "cpu_s": {rank: s}, "rss_mb": {rank:
                   MB}, "in_flight": runs, "waiting": n, "running": n, "totals": {drafted,
                   accepted, ...}})

A pulse goes only when something moved since the last one (a busy second, a counter), so an
idle job sends nothing and the console's picture stays still; what moved, moved within its
`span` (the probes between found nothing moving). The head does the same work
whether anyone watches or not: the front keeps the pulses and serves them to its watchers
(front/console.py); nothing is sent per token or per run."""

from __future__ import annotations

import time

from ..engine.worker.loop import PROBE_FIELDS
from ..report.metrics import rss_mb
from .stats import PER_RANK, SPECULATION, JobStats, speculation

BUSY_EVERY_S = 1.0   # how often the workers are asked (and at most how often a pulse goes)


class BusyProbe:
    """The workers' figures (PROBE_FIELDS) into `stats`: a probe through the pipeline every
    BUSY_EVERY_S (one out at a time; it passes each rank after the work sent before it);
    `on_answer` runs when one is back (without workers: every BUSY_EVERY_S)."""

    def __init__(self, head, stats: JobStats, on_answer=lambda: None):
        transport = getattr(head.setup.pipeline, "transport", None)
        self.transport = transport if hasattr(transport, "send_busy_probe") else None
        self.stats, self.on_answer = stats, on_answer
        self.out, self.sent = False, 0.0

    def tick(self) -> None:
        if not self.out:
            if time.monotonic() - self.sent >= BUSY_EVERY_S:
                self.sent = time.monotonic()
                if self.transport is None:
                    self.on_answer()
                    return
                self.transport.send_busy_probe()
                self.out = True
            return
        answer = self.transport.poll_busy()
        if answer is not None:
            self.out = False
            self._take(answer)
            self.on_answer()

    def _take(self, answer) -> None:
        fields = len(PROBE_FIELDS)
        for i in range(len(answer) // fields):
            for name, value in zip(PROBE_FIELDS, answer[i * fields:(i + 1) * fields]):
                getattr(self.stats, name)[i + 1] = float(value)

    def drain(self, limit_s: float = 2.0) -> None:
        """Take the answer of a probe still out (MPI must not end with it unreceived)."""
        deadline = time.monotonic() + limit_s
        while self.out and time.monotonic() < deadline:
            self.tick()
            time.sleep(0.005)


class Pulse:
    """The job's pulse (module docstring), sent through `stats.on_pulse` after each probe's
    answer if anything moved; `lanes` are the generations under way, `bridge` the requests'
    queue."""

    def __init__(self, head, stats: JobStats, bridge, lanes):
        self.head, self.stats, self.bridge, self.lanes = head, stats, bridge, lanes
        self._last: tuple | None = None
        self._measured = time.monotonic()

    def measure(self) -> dict:
        """The pulse now (the head's figures taken first)."""
        stats, pipeline = self.stats, self.head.setup.pipeline
        stats.busy_s[0] = pipeline.busy_s
        stats.cpu_s[0] = time.process_time()
        stats.rss_mb[0] = rss_mb()
        totals = {name: getattr(stats, name) for name in ("completion_tokens", "prompt_tokens",
                                                          "cancelled", *SPECULATION)}
        for lane in self.lanes.active:
            gen = getattr(lane, "gen", None)
            if gen is not None:
                for name, value in speculation(gen.counters).items():
                    totals[name] += value
        now = time.monotonic()
        span, self._measured = now - self._measured, now
        return {"at": now, "span": span, **{name: dict(getattr(stats, name))
                                            for name in PER_RANK},
                "in_flight": pipeline.in_flight, "waiting": self.bridge.depth,
                "running": len(self.bridge.running), "totals": totals}

    def send(self) -> None:
        pulse = self.measure()
        moved = (tuple(pulse["busy_s"].items()), tuple(pulse["totals"].values()),
                 pulse["in_flight"], pulse["waiting"], pulse["running"])
        if moved != self._last:
            self._last = moved
            self.stats.on_pulse(pulse)
