"""Polite waiting: poll, then sleep a little longer each time nothing happened.

Blocking MPI calls busy-wait; with more ranks than cores that steals the core a computing rank
needs. Every wait in pipeinfer polls and backs off instead.
"""

from __future__ import annotations

import time


class Backoff:
    """Sleep that grows while idle (up to `limit` seconds) and resets on activity."""

    def __init__(self, first: float = 20e-6, limit: float = 250e-6):
        self.first, self.limit = first, limit
        self.delay = 0.0

    def reset(self) -> None:
        self.delay = 0.0

    def wait(self) -> None:
        if self.delay:
            time.sleep(self.delay)
        self.delay = min(self.limit, max(self.first, self.delay * 2))


# Long idle waits. The sleep grows with the time it has been idle (a wake-up costs at
# most IDLE_LATENCY_SHARE of the gap it ends, never more than MAX_SLEEP_S), so a worker that
# waits between its passes wakes promptly while one idle for long costs next to no CPU.
IDLE_LATENCY_SHARE = 0.01
MAX_SLEEP_S = 5e-3


class IdleBackoff(Backoff):
    """Backoff whose ceiling rises from `limit` to `max_limit` the longer nothing happens."""

    def __init__(self, first: float = 20e-6, limit: float = 250e-6,
                 max_limit: float = MAX_SLEEP_S, share: float = IDLE_LATENCY_SHARE):
        super().__init__(first, limit)
        self.base_limit, self.max_limit, self.share = limit, max_limit, share
        self._idle_since: float | None = None

    def reset(self) -> None:
        super().reset()
        self._idle_since = None

    def wait(self) -> None:
        now = time.monotonic()
        if self._idle_since is None:
            self._idle_since = now
        idle = now - self._idle_since
        self.limit = min(self.max_limit, max(self.base_limit, idle * self.share))
        super().wait()
