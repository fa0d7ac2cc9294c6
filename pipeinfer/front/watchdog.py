"""A job that hangs instead of dying (a rank stopped, a host swapping to death, a network
partition where TCP does not reset) ends nothing by itself: no launcher exit, no channel
closed, no rank-failure line. The watchdog tells it apart from a slow one by the job's own
messages: while requests are under way, the job's head sends a token, an end or a beat
(serve/link.py: the pipeline returned results) at least every few seconds, however
slow its ranks are, as long as each of its runs comes back (a call, /metrics or /tokenize, is
answered at once by the head). Quiet for --stall-timeout seconds with requests or calls under
way: the job is taken as failed, killed and started again, its requests
resumed as after a crash. An idle service is never watched (a job with nothing to do says
nothing), and neither is a job still loading."""

from __future__ import annotations

import time
from pathlib import Path

DEFAULT_STALL_S = 60.0   # a job's runs, even a long prompt chunk on a slow node, take less
CHECK_EVERY_S = 1.0      # how often the watchdog looks (at most; less for short timeouts)


class Watchdog:
    def __init__(self, stall_s: float):
        self.stall_s = stall_s   # 0: off
        self.heard = time.monotonic()      # the job's last message
        self.busy_since: float | None = None   # requests under way since (None: idle)

    @property
    def every(self) -> float:
        return min(CHECK_EVERY_S, max(self.stall_s / 5, 0.1))

    def hear(self) -> None:
        """A message from the job that is up."""
        self.heard = time.monotonic()

    def quiet(self, busy: bool, now: float | None = None) -> float | None:
        """Seconds the job has been quiet with requests under way, if that is past the
        stall timeout (else None). `busy`: requests are under way on a job that is up."""
        now = time.monotonic() if now is None else now
        if not busy or self.stall_s <= 0:
            self.busy_since = None
            return None
        if self.busy_since is None:
            self.busy_since = now   # (quiet while idle is no stall: count from now)
        quiet = now - max(self.heard, self.busy_since)
        return quiet if quiet >= self.stall_s else None


def stopped_ranks(statuses: list, here: str) -> list[tuple[int, int]]:
    """(rank, pid) of the job's ranks on this host that are stopped (SIGSTOP, a debugger):
    what the front can see of which rank hangs, without asking the job."""
    out = []
    for rank, host, pid in statuses:
        if host == here and _state(pid) in ("T", "t"):
            out.append((rank, pid))
    return out


def _state(pid: int) -> str:
    """The process's state letter from /proc (R, S, D, T, ...; "" if unknown)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return text.rpartition(")")[2].split()[0] if ")" in text else ""
