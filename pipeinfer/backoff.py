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
