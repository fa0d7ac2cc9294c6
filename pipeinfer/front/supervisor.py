"""The front's job, kept running: launch it, take its head's messages, notice when it ends,
and launch it again on the hosts that still answer (hosts.py), at a back-off unless it had
been up for USEFUL_S, up to --max-restarts times in a row. Hosts left out are probed every
REJOIN_EVERY_S; one that answers again joins at the next moment no request is under way (or
after REJOIN_WAIT_S): the job is stopped in order and started again on every host, its
requests resumed.

The launcher's stderr passes through the front, which reads in it which rank failed (the
rank supervisors' `pipeinfer: error: rank N ...` lines) to know which host to blame. A job
that hangs instead (quiet for --stall-timeout seconds while requests or calls are under
way: watchdog.py) is killed and taken as failed, its stopped rank on this host (if one is) blamed.
Each job's start, readiness and end, and each request resumed, go to --trace (trace.py).

States, as /health reports them: loading (the first job starting), ok, recovering (a job
ended; requests wait and resume on the next one), waiting (no host answers: every request
gets a 503 until one does), failed (given up), stopping."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import socket
import sys
import time
from dataclasses import dataclass, field

from .channel import Channel
from .hosts import HostSet
from .launcher import Launcher, kill_group, placed
from .metrics import ServiceMetrics
from .table import Pending, Table
from .takeover import takeover_env
from .trace import FrontTrace
from .watchdog import DEFAULT_STALL_S, Watchdog, stopped_ranks

log = logging.getLogger(__name__)

END_WAIT_S = 5.0        # after its head went away, for the launcher to end the rest
STOP_WAIT_S = 20.0      # an orderly stop, before the job is killed (all gone within 30 s)
BACKOFF_S = (0.0, 1.0, 2.0, 5.0, 10.0, 30.0)   # before the 1st, 2nd, ... launch in a row
STABLE_S = 60.0         # a job up this long resets the count of restarts in a row
USEFUL_S = 10.0         # a job up this long is started again without a back-off
REJOIN_EVERY_S = float(os.environ.get("PIPEINFER_REJOIN_S", 30.0))
REJOIN_WAIT_S = 120.0   # a host back joins at the next idle moment, or after this long
RANK_FAILED = re.compile(r"pipeinfer: error: rank (\d+) ")


@dataclass
class Job:
    number: int
    proc: asyncio.subprocess.Process
    ready: float | None = None
    lost: str = ""          # why it is ending (its head's message)
    error: str = ""         # why it failed to start
    failed_rank: int | None = None
    planned: bool = False   # stopped by the front to take a host back
    head_pid: int | None = None
    info: dict = field(default_factory=dict)
    traced: bool = False    # its end is in the trace
    placed: list = field(default_factory=list)   # each rank's host (launcher.placed)


class Supervisor:
    def __init__(self, launcher: Launcher, table: Table, metrics: ServiceMetrics,
                 max_restarts: int, reach: str | None = None,
                 stall_s: float = DEFAULT_STALL_S, trace: FrontTrace | None = None):
        self.launcher, self.table, self.metrics = launcher, table, metrics
        self.max_restarts = max_restarts
        self.watchdog = Watchdog(stall_s)
        self.trace = trace or FrontTrace(None)
        table.on_resumed = self._resumed
        self.loop = asyncio.get_running_loop()
        self.channel = Channel(self._deliver, reach)
        self.hosts = HostSet(launcher.hosts, launcher.ranks, self.trace)
        self.state, self.reason = "loading", ""
        self.on_state = lambda: None   # the state or reason changed (the console's)
        self.last_ready: tuple[dict, list] | None = None
        self.job: Job | None = None
        self.stopping = False
        self.ever_ready = False
        self.on_fatal = lambda: None   # the first job cannot start: the front ends
        self.on_pulse = lambda job, pulse: None   # the job's pulse (the console's)
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
        self.watchdog.hear()
        if message is None or message[0] == "lost":
            job.lost = job.lost or (message[1] if message else "its head went away")
            self._ended.set()
        elif message[0] == "ready":
            self._ready(job, message[1])
        elif message[0] == "startfailed":
            job.error = message[1]
        elif message[0] == "hello":
            job.head_pid = message[1] if message[3] == socket.gethostname() else None
        elif message[0] == "beat":
            pass   # (its pipeline worked: progress, nothing for the table)
        elif message[0] == "stats":
            self.metrics.job_stats(job.number, message[1])
        elif message[0] == "pulse":
            self.on_pulse(job.number, message[1])
        else:
            self.table.receive(message)

    def _ready(self, job: Job, info: dict) -> None:
        job.ready, job.info = time.monotonic(), info
        self.last_ready = (info, job.placed)   # what a job after a lost host may keep
        self.ever_ready = True
        statuses = info.get("statuses", [])
        self.trace.record("job_ready", job=job.number, ranks=[
            {"rank": r, "host": h, "pid": p} for r, h, p in statuses])
        resuming = self.table.resend(self.send, job.number)
        if self._failed_at is not None:
            took = job.ready - self._failed_at
            self.metrics.recovery.observe(took)
            log.info("job %d took requests %.1f s after the failure; %d request(s) resume",
                     job.number, took, resuming)
            self.trace.record("recovered", job=job.number, seconds=round(took, 3),
                              requests=resuming)
            self._failed_at = None
        hosts = sorted({s[1] for s in statuses})
        log.info("job %d ready: %d ranks on %s", job.number, len(info.get("statuses", [])),
                 ", ".join(hosts))
        self._set_state("ok")

    def _set_state(self, state: str, reason: str = "") -> None:
        self.state, self.reason = state, reason
        self.on_state()

    def _resumed(self, request: Pending) -> None:
        """`request` is sent again, to a new job, with the tokens it has sent."""
        self.metrics.resumed.inc()
        tokens = [len(request.tokens.get(i, [])) for i in range(max(request.tokens,
                                                                    default=-1) + 1)]
        self.trace.record("resume", job=request.job, request=request.rid, kind=request.kind,
                          tokens=tokens, sent=sum(tokens))

    def send(self, message: tuple) -> bool:
        job = self.job
        return job is not None and job.ready is not None and \
            self.channel.send(job.number, message)

    @property
    def number(self) -> int:
        """The number of the latest job launched (0 before the first)."""
        return self.job.number if self.job is not None else 0

    @property
    def info(self) -> dict:
        """What the latest job said of itself once ready: its ranks, slots and context."""
        return self.job.info if self.job is not None else {}

    @property
    def up(self) -> int:
        """The number of the job taking requests, -1 while none is."""
        return self.job.number if self.job is not None and self.job.ready else -1

    # --- the loop ------------------------------------------------------------------------
    async def run(self) -> None:
        rejoin = asyncio.ensure_future(self._rejoin())
        watch = asyncio.ensure_future(self._watchdog())
        try:
            await self._keep_running()
        finally:
            rejoin.cancel()
            watch.cancel()

    async def _keep_running(self) -> None:
        in_a_row, useful = 0, False
        while not self.stopping:
            if in_a_row > self.max_restarts:
                self._give_up(in_a_row)
                return
            # (a job that served for USEFUL_S before it failed is started again at once:
            # the back-off is for jobs that fail as they start)
            await asyncio.sleep(0.0 if useful else BACKOFF_S[min(in_a_row, len(BACKOFF_S) - 1)])
            if self.job is not None and not self.job.planned:
                await self.hosts.leave_out_silent(self.launcher.probe)
            if self.hosts.ranks < 1 or self.hosts.hosts == []:
                self._waiting_for_hosts()
                in_a_row = min(in_a_row + 1, self.max_restarts)  # (no giving up here)
                continue
            job = await self._launch()
            await self._watch(job)
            self._ended_trace(job)
            if self.stopping:
                return
            if job.ready is None and not self.ever_ready and not self.hosts.changed:
                self._give_up(1, "the job failed to start")   # (nothing to fail over from:
                return                                         # a wrong option or model)
            if job.planned:
                in_a_row = 0
                continue
            up = time.monotonic() - job.ready if job.ready is not None else 0.0
            stable, useful = up >= STABLE_S, up >= USEFUL_S
            if stable:
                self.hosts.stable()
            elif job.failed_rank is not None:
                self.hosts.failed(job.failed_rank)
            in_a_row = 1 if stable else in_a_row + 1
            self._lost(job)

    async def _launch(self) -> Job:
        if self.state == "waiting":   # hosts answer again
            self._set_state("recovering", "hosts answer again: starting the job")
        self._launches += 1
        number = self._launches
        hosts, ranks = self.hosts.hosts, self.hosts.ranks
        command = self.launcher.command(self.channel.address, hosts, ranks,
                                        self.hosts.changed)
        self.channel.expect(number)
        env = dict(os.environ, **self.channel.env(number))
        where = placed(hosts, ranks)
        env.update(takeover_env(self.last_ready, where) if self.hosts.changed else {})
        log.info("starting job %d: %d ranks%s", number, ranks,
                 f" on {', '.join(h.name for h in hosts)}" if hosts else "")
        self.trace.record("job_start", job=number, ranks=ranks,
                          hosts=[h.name for h in hosts] if hosts else [socket.gethostname()])
        log.debug("job %d: %s", number, " ".join(command))
        proc = await asyncio.create_subprocess_exec(*command, env=env, start_new_session=True,
                                                    stdin=asyncio.subprocess.DEVNULL,
                                                    stderr=asyncio.subprocess.PIPE)
        self._ended = asyncio.Event()
        self.job = Job(number, proc, placed=where)
        return self.job

    async def _relay(self, job: Job) -> None:
        """The launcher's stderr to ours, noting which rank failed."""
        while line := await job.proc.stderr.readline():
            text = line.decode(errors="replace")
            sys.stderr.write(text)
            if job.failed_rank is None and (m := RANK_FAILED.search(text)):
                job.failed_rank = int(m.group(1))
                job.lost = job.lost or text.strip()
                self._ended.set()   # (the launcher should end the rest: _watch sees to it)

    async def _watch(self, job: Job) -> None:
        """Until the job has ended (its processes gone)."""
        relay = asyncio.ensure_future(self._relay(job))
        exited = asyncio.ensure_future(job.proc.wait())
        lost = asyncio.ensure_future(self._ended.wait())
        await asyncio.wait([exited, lost], return_when=asyncio.FIRST_COMPLETED)
        if not exited.done():   # a rank failed: the launcher ends the rest, or we do
            try:
                await asyncio.wait_for(asyncio.shield(exited), END_WAIT_S)
            except asyncio.TimeoutError:
                log.warning("job %d: its launcher did not end it within %.0f s: killing it",
                            job.number, END_WAIT_S)
                self._kill(job)
                await exited
        lost.cancel()
        try:
            await asyncio.wait_for(relay, 2.0)
        except asyncio.TimeoutError:
            pass

    async def _watchdog(self) -> None:
        """A job up and quiet for the stall timeout while requests are under way: hung."""
        while True:
            await asyncio.sleep(self.watchdog.every)
            job = self.job
            up = job is not None and job.ready is not None and not job.lost and \
                job.proc.returncode is None and not (self.stopping or job.planned)
            # (a call, /metrics or /tokenize, left unanswered is work under way too: a
            # stopped head is found by the next scrape)
            quiet = self.watchdog.quiet(up and bool(self.table.requests or self.table.calls))
            if quiet is not None:
                self._hung(job, quiet)

    def _hung(self, job: Job, quiet: float) -> None:
        """The job sent nothing for `quiet` s with work under way: killed, and failed
        over as if a rank had died (a stopped rank on this host is named and blamed)."""
        stopped = stopped_ranks(job.info.get("statuses", []), socket.gethostname())
        which = "; ".join(f"rank {r} (pid {p}) is stopped" for r, p in stopped)
        job.lost = (f"no progress for {quiet:.0f} s with {len(self.table.requests)} "
                    f"request(s) and {len(self.table.calls)} call(s) under way "
                    f"(--stall-timeout {self.watchdog.stall_s:g})"
                    f"{': ' + which if which else ''}")
        if stopped:
            job.failed_rank = stopped[0][0]
        log.warning("job %d hangs: %s; killing it", job.number, job.lost)
        self.metrics.stalls.inc()
        self.trace.record("stall", job=job.number, quiet_s=round(quiet, 1),
                          requests=len(self.table.requests), calls=len(self.table.calls),
                          stopped=stopped)
        self._kill(job)
        self._ended.set()

    def _ended_trace(self, job: Job) -> None:
        if job.traced:
            return
        job.traced = True
        self.trace.record("job_end", job=job.number, reason=self._why(job),
                          ready=job.ready is not None, failed_rank=job.failed_rank,
                          planned=job.planned or self.stopping,
                          returncode=job.proc.returncode)

    @staticmethod
    def _why(job: Job) -> str:
        return job.lost or job.error or f"its launcher exited with status {job.proc.returncode}"

    def _kill(self, job: Job) -> None:
        """SIGKILL to the launcher's process group and to the job's ranks on this host (a
        rank stuck in a blocking MPI call would otherwise keep the launcher waiting for its
        output)."""
        kill_group(job.proc.pid, signal.SIGKILL)
        here = socket.gethostname()
        pids = {p for _, host, p in job.info.get("statuses", []) if host == here}
        for pid in pids | ({job.head_pid} if job.head_pid else set()):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def _lost(self, job: Job) -> None:
        """The job ended by itself: requests wait for the next one."""
        self._failed_at = self._failed_at or time.monotonic()
        self.table.fail_calls()
        why = self._why(job)
        self._set_state("recovering", f"job {job.number} ended ({why}); starting it again")
        self.metrics.restarts.inc()
        log.warning("job %d ended: %s; %d request(s) wait to resume", job.number, why,
                    len(self.table.requests))

    def _waiting_for_hosts(self) -> None:
        """No host answers: every request, those under way and those that come, gets a 503
        saying so (app.py) until a host answers again (_rejoin takes it back)."""
        self._set_state("waiting", "no host that answers is left to hold the model; waiting "
                        "for one to come back")
        log.warning("%s", self.reason)
        self.table.fail_all(503, f"the server cannot run: {self.reason}")

    def _give_up(self, in_a_row: int, what: str = "") -> None:
        job = self.job
        why = job.error if job is not None and job.error else \
            job.lost if job is not None and job.lost else self.reason or \
            f"its launcher exited with status {job.proc.returncode}"
        what = what or (f"the job failed {in_a_row} times in a row (--max-restarts "
                        f"{self.max_restarts})")
        self._set_state("failed", f"{what}: {why}")
        log.error("giving up: %s", self.reason)
        self.trace.record("give_up", reason=self.reason)
        self.table.fail_all(503, self.reason)
        if not self.ever_ready:
            self.on_fatal()

    async def _rejoin(self) -> None:
        """Hosts left out that answer again: back at the next idle moment (or after
        REJOIN_WAIT_S), by stopping the job in order and starting it on every host."""
        found_at = None
        while True:
            await asyncio.sleep(REJOIN_EVERY_S if found_at is None else 1.0)
            if not self.hosts.left:
                continue
            back = await self.hosts.returning(self.launcher.probe)
            if not back:
                found_at = None
                continue
            if self.up < 0:   # no job up: the next launch takes them
                self.hosts.take_back(back)
                continue
            found_at = found_at or time.monotonic()
            if self.table.requests and time.monotonic() - found_at < REJOIN_WAIT_S:
                continue
            self.hosts.take_back(back)
            found_at = None
            self.job.planned = True
            self._set_state("recovering", "taking back hosts that answer again")
            self.channel.send(self.job.number, ("stop",))

    async def stop(self) -> None:
        """End the job in order (STOP_WAIT_S, then killed): every rank is gone after."""
        self.stopping = True
        self._set_state("stopping")
        job = self.job
        self.trace.record("front_stop", job=job.number if job is not None else None)
        if job is not None and job.proc.returncode is None:
            self.channel.send(job.number, ("stop",))
            try:
                await asyncio.wait_for(job.proc.wait(), STOP_WAIT_S)
            except asyncio.TimeoutError:
                log.warning("job %d did not end within %.0f s: killing it", job.number,
                            STOP_WAIT_S)
                kill_group(job.proc.pid, signal.SIGKILL)
                await job.proc.wait()
            self._ended_trace(job)
        self.channel.close()
        self.trace.close()
