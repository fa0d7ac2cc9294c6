"""Which of the user's hosts the front's next job runs on: all of them at first; a host that
does not answer the launcher's probe is left out (the ranks it held with it), and so is one
whose rank failed HOST_FAILURES times in a row; a host left out that answers again is taken
back (one left out for its rank's failures answered all along: it waits QUARANTINE_S first,
or it would be taken back, fail again and be left out again, over and over). Ranks fill the
hosts as the launcher places them (launcher.placement), so the job
keeps the ranks of the hosts that remain."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import Counter
from typing import Awaitable, Callable

from .launcher import Host, placement
from .trace import FrontTrace

log = logging.getLogger(__name__)

HOST_FAILURES = 3   # a host whose rank failed this many times in a row is left out
QUARANTINE_S = float(os.environ.get("PIPEINFER_QUARANTINE_S", 600.0))  # ... for this long

Probe = Callable[[Host], Awaitable[bool]]


class HostSet:
    def __init__(self, hosts: list[Host] | None, ranks: int, trace: FrontTrace | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.all, self.total = hosts, ranks
        self.trace = trace or FrontTrace(None)
        self.held = placement(hosts, ranks) if hosts else {}
        self.left: list[Host] = []
        self.failures: Counter[str] = Counter()
        self.clock = clock
        self.quarantined: dict[str, float] = {}   # host -> until when it may not come back

    @property
    def hosts(self) -> list[Host] | None:
        """The hosts of the next job (None: this host only, none named)."""
        if self.all is None:
            return None
        return [h for h in self.all if h not in self.left]

    @property
    def ranks(self) -> int:
        return self.total - sum(self.held[h.name] for h in self.left)

    @property
    def changed(self) -> bool:
        return bool(self.left)

    def host_of(self, rank: int) -> Host | None:
        """The host of `rank` in the job now running (ranks fill its hosts in order)."""
        hosts = self.hosts
        if not hosts:
            return None
        placed = placement(hosts, self.ranks)
        for host in hosts:
            held = placed[host.name]
            if rank < held:
                return host
            rank -= held
        return None

    async def leave_out_silent(self, probe: Probe) -> list[Host]:
        """Probe the hosts in use; the ones that do not answer are left out."""
        hosts = self.hosts or []
        answers = await asyncio.gather(*(probe(h) for h in hosts))
        gone = [h for h, ok in zip(hosts, answers) if not ok]
        for host in gone:
            self._leave(host, "does not answer")
        return gone

    def failed(self, rank: int) -> None:
        """The rank `rank` of the job failed: its host is left out the HOST_FAILURES-th time
        in a row."""
        host = self.host_of(rank)
        if host is None:
            return
        self.failures[host.name] += 1
        if self.failures[host.name] >= HOST_FAILURES and len(self.hosts or []) > 1:
            self.quarantined[host.name] = self.clock() + QUARANTINE_S
            self._leave(host, f"answers, but its rank failed {HOST_FAILURES} times in a row "
                              f"(not taken back for {QUARANTINE_S:.0f} s)")

    def stable(self) -> None:
        """A job ran long enough: failures so far were not a host's fault."""
        self.failures.clear()

    def _leave(self, host: Host, why: str) -> None:
        self.left.append(host)
        self.failures.pop(host.name, None)
        self.trace.record("host_left", host=host.name, why=why, ranks=self.ranks)
        log.warning("host %s %s: left out (it held %d rank(s)); the next job runs %d ranks "
                    "on %s, its split planned again", host.name, why, self.held[host.name],
                    self.ranks, ", ".join(h.name for h in self.hosts or []) or "no host")

    async def returning(self, probe: Probe) -> list[Host]:
        """The hosts left out that answer again (past their quarantine, if any)."""
        now = self.clock()
        candidates = [h for h in self.left if self.quarantined.get(h.name, now) <= now]
        answers = await asyncio.gather(*(probe(h) for h in candidates))
        return [h for h, ok in zip(candidates, answers) if ok]

    def take_back(self, hosts: list[Host]) -> None:
        self.left = [h for h in self.left if h not in hosts]
        for host in hosts:
            self.quarantined.pop(host.name, None)
        self.trace.record("host_back", hosts=[h.name for h in hosts], ranks=self.ranks)
        log.warning("host(s) %s answer again: the next job runs %d ranks on %s",
                    ", ".join(h.name for h in hosts), self.ranks,
                    ", ".join(h.name for h in self.hosts or []))
