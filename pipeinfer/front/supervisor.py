"""The front's job, kept running: launch it, take its head's messages, notice when it ends,
and launch it again, on the hosts that still answer, at a back-off, up to --max-restarts
times in a row; a host that left is probed now and then, and one that answers again joins
at the next moment the service is idle (or after REJOIN_WAIT_S).

States, as /health reports them: loading (the first job starting), ok, recovering (a job
ended; requests wait and resume on the next one), failed (given up), stopping."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from dataclasses import dataclass, field

from .channel import Channel
from .launcher import Host, Launcher, kill_group, placement
from .metrics import FrontMetrics
from .table import Table

log = logging.getLogger(__name__)

END_WAIT_S = 5.0        # after its head went away, for the launcher to end the rest
STOP_WAIT_S = 20.0      # an orderly stop, before the job is killed (all gone within 30 s)
BACKOFF_S = (0.0, 1.0, 2.0, 5.0, 10.0, 30.0)   # before the 1st, 2nd, ... launch in a row
STABLE_S = 60.0         # a job up this long resets the count of restarts in a row
REJOIN_EVERY_S = 30.0   # how often hosts that left are probed
REJOIN_WAIT_S = 120.0   # a host back joins at the next idle moment, or after this long


@dataclass
class Job:
    number: int
    proc: asyncio.subprocess.Process
    started: float = field(default_factory=time.monotonic)
    ready: float | None = None
    lost: str = ""          # why it is ending (its head's message)
    error: str = ""         # why it failed to start
    info: dict = field(default_factory=dict)


class Supervisor:
    def __init__(self, launcher: Launcher, table: Table, metrics: FrontMetrics,
                 max_restarts: int, tcp_host: str | None = None):
        self.launcher, self.table, self.metrics = launcher, table, metrics
        self.max_restarts = max_restarts
        self.loop = asyncio.get_running_loop()
        self.channel = Channel(self._deliver, tcp_host)
        self.state, self.reason = "loading", ""
        self.job: Job | None = None
        self.hosts = list(launcher.hosts) if launcher.hosts else None
        self.left: list[Host] = []   # hosts that stopped answering
        self.ranks = launcher.ranks
        self.stopping = False
        self._ended = asyncio.Event()
        self._failed_at: float | None = None
        self._launches = 0

    # --- messages from the job's head (on the event loop) --------------------------------
    def _deliver(self, job: int, message: tuple | None) -> None:
        self.loop.call_soon_threadsafe(self._receive, job, message)

    def _receive(self, number: int, message: tuple | None) -> None:
        job = self.job
        if job is None or number != job.number:
            return
        if message is None or message[0] == "lost":
            job.lost = job.lost or (message[1] if message else "its head went away")
            self._ended.set()
        elif message[0] == "ready":
            self._ready(job, message[1])
        elif message[0] == "startfailed":
            job.error = message[1]
        elif message[0] != "hello":
            self.table.receive(message)

    def _ready(self, job: Job, info: dict) -> None:
        job.ready, job.info = time.monotonic(), info
        resuming = self.table.resend(self.send, job.number)
        if self._failed_at is not None:
            took = job.ready - self._failed_at
            self.metrics.recovery.observe(took)
            log.info("job %d ready %.1f s after the failure; %d request(s) resume",
                     job.number, took, resuming)
            self._failed_at = None
        hosts = sorted({s[1] for s in info.get("statuses", [])})
        log.info("job %d ready: %d ranks on %s", job.number, len(info.get("statuses", [])),
                 ", ".join(hosts))
        self.state, self.reason = "ok", ""

    def send(self, message: tuple) -> bool:
        job = self.job
        return job is not None and job.ready is not None and \
            self.channel.send(job.number, message)

    @property
    def up(self) -> int:
        """The number of the job taking requests, -1 while none is."""
        return self.job.number if self.job is not None and self.job.ready else -1

    # --- the loop ------------------------------------------------------------------------
    async def run(self) -> None:
        in_a_row = 0
        while not self.stopping:
            if in_a_row > self.max_restarts:
                self._give_up(in_a_row)
                return
            await asyncio.sleep(BACKOFF_S[min(in_a_row, len(BACKOFF_S) - 1)])
            if self.stopping:
                return
            if not await self._usable_hosts():
                in_a_row += 1
                continue
            job = await self._launch()
            await self._watch(job)
            if self.stopping:
                return
            stable = job.ready is not None and time.monotonic() - job.ready >= STABLE_S
            in_a_row = 1 if stable else in_a_row + 1
            self._lost(job)

    async def _launch(self) -> Job:
        self._launches += 1
        number = self._launches
        replanned = self.hosts != self.launcher.hosts or self.ranks != self.launcher.ranks
        command = self.launcher.command(self.channel.address, self.hosts, self.ranks,
                                        replanned)
        self.channel.expect(number)
        env = dict(os.environ, **self.channel.env(number))
        log.info("starting job %d: %d ranks%s", number, self.ranks,
                 f" on {', '.join(h.name for h in self.hosts)}" if self.hosts else "")
        log.debug("job %d: %s", number, " ".join(command))
        proc = await asyncio.create_subprocess_exec(*command, env=env, start_new_session=True,
                                                    stdin=asyncio.subprocess.DEVNULL)
        self._ended = asyncio.Event()
        self.job = Job(number, proc)
        return self.job

    async def _watch(self, job: Job) -> None:
        """Until the job has ended (its processes gone)."""
        exited = asyncio.ensure_future(job.proc.wait())
        lost = asyncio.ensure_future(self._ended.wait())
        await asyncio.wait([exited, lost], return_when=asyncio.FIRST_COMPLETED)
        if not exited.done():   # its head went away: the launcher ends the rest, or we do
            try:
                await asyncio.wait_for(asyncio.shield(exited), END_WAIT_S)
            except asyncio.TimeoutError:
                kill_group(job.proc.pid, signal.SIGKILL)
                await exited
        lost.cancel()

    def _lost(self, job: Job) -> None:
        """The job ended by itself: requests wait for the next one."""
        self._failed_at = self._failed_at or time.monotonic()
        self.table.fail_calls()
        why = job.lost or job.error or f"its launcher exited with status {job.proc.returncode}"
        self.state = "recovering"
        self.reason = f"job {job.number} ended ({why}); starting it again"
        self.metrics.restarts.inc()
        log.warning("job %d ended: %s; %d request(s) wait to resume", job.number, why,
                    len(self.table.requests))

    def _give_up(self, in_a_row: int) -> None:
        why = self.job.error if self.job is not None and self.job.error else self.reason
        self.state = "failed"
        self.reason = (f"the job failed {in_a_row} times in a row (--max-restarts "
                       f"{self.max_restarts}): {why}")
        log.error("giving up: %s", self.reason)
        self.table.fail_all(503, self.reason)

    async def _usable_hosts(self) -> bool:
        """After a failure, leave out the hosts that do not answer; False when the ones left
        hold no rank (the service waits for a host to come back)."""
        if self.hosts is None or self.job is None:
            return True
        answers = await asyncio.gather(*(self.launcher.probe(h) for h in self.hosts))
        gone = [h for h, ok in zip(self.hosts, answers) if not ok]
        if not gone:
            return True
        held = placement(self.hosts, self.ranks)
        self.hosts = [h for h in self.hosts if h not in gone]
        self.left += gone
        self.ranks -= sum(held[h.name] for h in gone)
        for host in gone:
            log.warning("host %s does not answer: left out (it held %d rank(s)); the split "
                        "is planned again for %d ranks", host.name, held[host.name],
                        self.ranks)
        if self.ranks < 1 or not self.hosts:
            self.reason = "no host answers; waiting for one to come back"
            self.hosts = self.hosts or []
            return False
        return True

    async def stop(self) -> None:
        """End the job in order (STOP_WAIT_S, then killed): every rank is gone after."""
        self.stopping = True
        self.state = "stopping"
        self._ended.set()
        job = self.job
        if job is not None and job.proc.returncode is None:
            self.channel.send(job.number, ("stop",))
            try:
                await asyncio.wait_for(job.proc.wait(), STOP_WAIT_S)
            except asyncio.TimeoutError:
                log.warning("job %d did not end within %.0f s: killing it", job.number,
                            STOP_WAIT_S)
                kill_group(job.proc.pid, signal.SIGKILL)
                await job.proc.wait()
        self.channel.close()
