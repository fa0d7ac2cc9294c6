"""Polite waiting: poll, then sleep a little longer each time nothing happened.

Blocking MPI calls busy-wait; with more ranks than cores that steals the core a computing rank
needs. Every wait in pipeinfer polls and backs off instead. The sleeps end early when another
rank wakes this one (engine/transport/wakeup.py, once the job has connected its wake-ups): a woken
back-off starts again from short sleeps. A wait that every message it waits for wakes
(`idle_backoff(woken=True)`) sleeps until woken after activity: its short sleeps are only for
what a wake-up announced and a probe does not see yet.
"""

from __future__ import annotations

import time
from typing import Callable

from . import wakeup
from .wakeup import Channel

Sleep = Callable[[float], bool]  # sleep at most so long; True if woken early


class Backoff:
    """Sleep that grows while idle (up to `limit` seconds) and resets on activity. `channel`
    is the wake-up channel the sleeps listen on; `sleep`, if given, sleeps instead (e.g. a
    link's, which also keeps its own sends moving)."""

    def __init__(self, first: float = 20e-6, limit: float = 250e-6,
                 channel: Channel = Channel.MAIN, sleep: Sleep | None = None):
        self.first, self.limit = first, limit
        self.delay = 0.0
        self._sleep = sleep or (lambda seconds: wakeup.sleep(seconds, channel))

    def reset(self) -> None:
        self.delay = 0.0

    def wait(self) -> bool:
        """One sleep (none right after a reset); True if a wake-up ended it (the back-off is
        reset then: what woke it may need a few quick looks to arrive)."""
        if self.delay and self._sleep(self.delay):
            self.woken()
            return True
        self.delay = self.next_delay()
        return False

    def woken(self) -> None:
        self.reset()

    def next_delay(self) -> float:
        return min(self.limit, max(self.first, self.delay * 2))


# Long idle waits. The sleep grows with the time it has been idle (a wake-up costs at
# most IDLE_LATENCY_SHARE of the gap it ends, never more than MAX_SLEEP_S), so a worker that
# waits between its passes wakes promptly while one idle for long costs next to no CPU.
IDLE_LATENCY_SHARE = 0.01
MAX_SLEEP_S = 5e-3
# A wait that wake-ups end (every message it waits for wakes it): the sleep is then only a
# safety net against a lost wake-up, and one that grows fast and long keeps an idle rank's CPU
# near zero. After activity it starts at WOKEN_QUIET_S, not with quick looks: on a loaded node
# each look and each sleep costs the waiting thread tens of microseconds of CPU (a select()
# call, a probe, a scheduler tick), and nothing is on its way that a wake-up has not announced.
# A lost wake-up delays a pick-up by at most WOKEN_QUIET_S, or 3 times the time waited so far.
# WOKEN_QUIET_S is longer than a token's round trip through a fast pipeline (SmolLM2 on four
# half-core nodes: 13 ms), so the sleep after a run goes out is ended by its result's wake-up,
# not by a timeout and another look.
WOKEN_LATENCY_SHARE = 3.0
WOKEN_MAX_SLEEP_S = 0.1
WOKEN_QUIET_S = 30e-3


def idle_backoff(woken: bool, channel: Channel = Channel.MAIN,
                 sleep: Sleep | None = None) -> "IdleBackoff":
    """An idle wait on `channel` (`sleep`: e.g. a link's, which keeps its sends moving): with
    wake-ups from every rank it waits for (wakeup.woken_by) its sleeps may grow long, as a
    message ends them; else they stay short, as only a poll finds what came."""
    if not woken:
        return IdleBackoff(channel=channel, sleep=sleep)
    return IdleBackoff(max_limit=WOKEN_MAX_SLEEP_S, share=WOKEN_LATENCY_SHARE, channel=channel,
                       sleep=sleep, quiet=WOKEN_QUIET_S)


class IdleBackoff(Backoff):
    """Backoff whose ceiling rises from `limit` to `max_limit` the longer nothing happens.
    With `quiet`, the sleeps after activity start there instead of at `first` (quick looks
    follow only a wake-up, when what it announced may need a few to arrive)."""

    def __init__(self, first: float = 20e-6, limit: float = 250e-6,
                 max_limit: float = MAX_SLEEP_S, share: float = IDLE_LATENCY_SHARE,
                 channel: Channel = Channel.MAIN, sleep: Sleep | None = None,
                 quiet: float = 0.0):
        super().__init__(first, limit, channel, sleep)
        self.base_limit, self.max_limit, self.share = limit, max_limit, share
        self.quiet = quiet
        self._idle_since: float | None = None
        self._announced = False   # a wake-up ended the last sleep: something is coming

    def reset(self) -> None:
        super().reset()
        self._idle_since = None
        self._announced = False
        self.delay = self.quiet   # (0 without: one more look first)

    def woken(self) -> None:
        self.reset()
        self._announced = True
        self.delay = 0.0          # look at once

    def next_delay(self) -> float:
        if self.quiet and not self._announced:
            return max(self.limit, self.quiet)
        return super().next_delay()

    def wait(self) -> bool:
        now = time.monotonic()
        if self._idle_since is None:
            self._idle_since = now
        idle = now - self._idle_since
        self.limit = min(self.max_limit, max(self.base_limit, idle * self.share))
        return super().wait()


# A rank with sends not yet complete sleeps at most this long at first: a large message moves
# only while its sender calls into MPI, and a receiver already waiting for it should get it
# at once. While the sends stay incomplete (the receiver is busy computing and has not asked
# for them) the interval doubles up to the cap, so a rank whose next stage computes for a
# second does not wake thousands of times for it.
SEND_PROGRESS_S = 250e-6
SEND_PROGRESS_MAX_S = 8e-3


class ProgressPace:
    """How long a rank with incomplete sends may sleep before it calls into MPI again: short
    after a new send or a wake-up (a receiver about to take a large message wakes its
    sender), then twice as long each time, up to `limit`."""

    def __init__(self, first: float = SEND_PROGRESS_S, limit: float = SEND_PROGRESS_MAX_S):
        self.first, self.limit = first, limit
        self._next = first

    def reset(self) -> None:
        self._next = self.first

    def take(self) -> float:
        """The longest sleep allowed now (and the next one doubles)."""
        seconds = self._next
        self._next = min(self.limit, seconds * 2)
        return seconds
