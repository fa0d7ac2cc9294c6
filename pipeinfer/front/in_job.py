"""The front of a job someone else launched (`mpiexec -n N pipeinfer serve`, `srun`): the
same HTTP app and request table as `serve --ranks N`, on a thread of rank 0, talking to the
head on rank 0's main thread over an in-process pipe (the same messages as over the front's
socket: serve/link.py). There is no failover: the job that ends is the service that ends,
so a job that is lost answers every request 503 with the reason, as does one that never
started.

States, as /health reports them: loading, ok, failed, stopping."""

from __future__ import annotations

import asyncio
import logging
import threading
from multiprocessing.connection import Connection

from ..config.serving import ServeConfig
from .console import Console
from .main import FrontThread
from .metrics import ServiceMetrics
from .table import Table

log = logging.getLogger(__name__)


class InJob:
    """The job this process is rank 0 of, as the front's app sees a job's keeper."""

    NUMBER = 1   # (the only job)

    def __init__(self, conn: Connection, table: Table, metrics: ServiceMetrics):
        self.conn, self.table, self.metrics = conn, table, metrics
        self.state, self.reason = "loading", ""
        self.info: dict = {}
        self.on_fatal = lambda: None
        self.on_state = lambda: None              # (the console's: console.py)
        self.on_pulse = lambda job, pulse: None
        self.on_record = lambda name, fields: None
        self.loop = asyncio.get_running_loop()
        self._lock = threading.Lock()
        threading.Thread(target=self._receive, name="front-pipe", daemon=True).start()

    @property
    def number(self) -> int:
        return self.NUMBER

    @property
    def up(self) -> int:
        """The job's number while it takes requests, else -1."""
        return self.NUMBER if self.state == "ok" else -1

    def send(self, message: tuple) -> bool:
        if self.state != "ok":
            return False
        with self._lock:
            try:
                self.conn.send(message)
                return True
            except (OSError, ValueError):
                return False

    def _receive(self) -> None:
        try:
            while True:
                message = self.conn.recv()
                self.loop.call_soon_threadsafe(self._deliver, message)
        except (EOFError, OSError):
            self.loop.call_soon_threadsafe(self._deliver, None)
        except RuntimeError:   # the event loop is closed: the front has ended
            pass

    def _deliver(self, message: tuple | None) -> None:
        kind = "closed" if message is None else message[0]
        if kind == "ready":
            self.info = message[1]
            self._set_state("ok")
            self.on_record("job_ready", {"job": self.NUMBER, "ranks": [
                {"rank": r, "host": h, "pid": p} for r, h, p in self.info.get("statuses", [])]})
        elif kind in ("lost", "startfailed", "closed"):
            self._failed(message[1] if message else "the job's head went away")
        elif kind == "stats":
            self.metrics.job_stats(self.NUMBER, message[1])
        elif kind == "pulse":
            self.on_pulse(self.NUMBER, message[1])
        elif kind not in ("hello", "beat"):
            self.table.receive(message)

    def _failed(self, why: str) -> None:
        if self.state in ("failed", "stopping"):
            return
        self._set_state("failed", why)
        self.on_record("job_end", {"job": self.NUMBER, "reason": why})
        self.table.fail_calls()
        self.table.fail_all(503, f"the server has failed: {why}")

    async def run(self) -> None:
        """(The job runs on rank 0's main thread: nothing to keep here.)"""

    def _set_state(self, state: str, reason: str = "") -> None:
        self.state, self.reason = state, reason
        self.on_state()

    async def stop(self) -> None:
        self._set_state("stopping")


class InJobFront(FrontThread):
    """The front on a thread of rank 0, its job's end of the pipe given."""

    def __init__(self, options: ServeConfig, conn: Connection):
        super().__init__(options, lambda table, metrics, console: _in_job(
            conn, table, metrics, console), "loading the model")


def _in_job(conn: Connection, table: Table, metrics: ServiceMetrics,
            console: Console) -> InJob:
    keeper = InJob(conn, table, metrics)
    keeper.on_record = console.record   # (its history: the job ready, or ended)
    return keeper
