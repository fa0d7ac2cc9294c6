"""Where a job's start-up goes, per rank: seconds since the rank's process started at each
step of Job.start (imports done, split planned, stage loaded, all agreed, kept cells taken
back), gathered on the head and logged as one line, so that a slow start (or a slow
relaunch after a failure) names its slow step and rank."""

from __future__ import annotations

import logging
import os
import time

log = logging.getLogger(__name__)


def process_age() -> float:
    """Seconds since this process started (from /proc; 0.0 where there is none)."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0
    return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))


class Marks:
    def __init__(self) -> None:
        self._origin = time.monotonic() - process_age()
        self.steps: list[tuple[str, float]] = []

    def mark(self, step: str) -> None:
        self.steps.append((step, round(time.monotonic() - self._origin, 2)))

    def report(self, link) -> None:
        """Collective: every rank's marks logged by the head."""
        every = link.gather((link.rank, self.steps))
        if link.rank == 0 and every:
            log.info("start-up, seconds since each rank's process started: %s", "; ".join(
                f"rank {rank} " + ", ".join(f"{step} {t:.1f}" for step, t in steps)
                for rank, steps in sorted(every)))
