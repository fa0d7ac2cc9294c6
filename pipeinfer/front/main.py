"""`pipeinfer serve --ranks N`: the front's process. The port is taken first (a port in use is
an error before anything starts); uvicorn and the supervisor share one event loop on a thread
of their own, and the main thread waits for SIGINT or SIGTERM, then ends every request with
503, the job in order (every rank gone within 30 s) and the HTTP server."""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from dataclasses import dataclass

import uvicorn

from ..serve.http_thread import listen_socket
from .app import Front, build_app
from .launcher import Host, Launcher
from .metrics import FrontMetrics
from .supervisor import Supervisor
from .table import Table
from .trace import FrontTrace

log = logging.getLogger(__name__)

SHUTDOWN_S = 28.0   # the job's orderly stop and the HTTP server's, together


@dataclass(frozen=True)
class FrontOptions:
    ranks: int
    hosts: tuple[Host, ...] | None
    mpiexec: str | None
    max_restarts: int
    job_args: tuple[str, ...]
    host: str
    port: int
    queue: int
    api_key: str | None
    model_name: str
    cors_origins: tuple[str, ...]
    slots: int
    stall_timeout: float = 60.0
    trace: str | None = None


class _Thread:
    """uvicorn and the supervisor on one event loop, on a thread of their own."""

    def __init__(self, options: FrontOptions):
        self.options, self.sock = options, listen_socket(options.host, options.port)
        self.port = self.sock.getsockname()[1]
        self.loop: asyncio.AbstractEventLoop | None = None
        self.started, self.error, self.failed = threading.Event(), None, False
        self.server: uvicorn.Server | None = None
        self.supervisor: Supervisor | None = None
        self.thread = threading.Thread(target=self._run, name="front", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as err:  # noqa: BLE001 (reported by main)
            self.error = err
        finally:
            self.started.set()

    async def _main(self) -> None:
        o = self.options
        self.loop = asyncio.get_running_loop()
        metrics = FrontMetrics()
        table = Table(o.queue + o.slots)   # (resumed requests: the supervisor counts)
        launcher = Launcher(o.mpiexec, o.ranks, list(o.hosts) if o.hosts else None,
                            list(o.job_args))
        self.supervisor = Supervisor(launcher, table, metrics, o.max_restarts,
                                     stall_s=o.stall_timeout, trace=FrontTrace(o.trace))
        self.supervisor.on_fatal = self._fatal
        front = Front(self.supervisor, table, metrics, o.model_name, o.api_key)
        config = uvicorn.Config(build_app(front, o.cors_origins), log_config=None,
                                log_level="warning", access_log=False, lifespan="off",
                                timeout_graceful_shutdown=1)
        self.server = uvicorn.Server(config)
        supervising = asyncio.ensure_future(self.supervisor.run())
        self.started.set()
        log.info("listening on http://%s:%d (starting the job: %d ranks)", o.host, self.port,
                 o.ranks)
        await self.server.serve(sockets=[self.sock])
        supervising.cancel()

    def _fatal(self) -> None:
        self.failed = True
        self.server.should_exit = True

    async def shutdown(self) -> None:
        self.supervisor.table.fail_all(503, "the server is shutting down")
        await asyncio.sleep(0.3)   # for the handlers to send it
        await self.supervisor.stop()
        self.server.should_exit = True


def main(options: FrontOptions) -> int:
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    front = _Thread(options)
    front.started.wait()
    while not stop.is_set() and front.thread.is_alive():
        stop.wait(0.5)
    if front.error is not None:
        log.error("the front failed: %r", front.error)
    if front.thread.is_alive() and front.loop is not None:
        log.warning("stopping: ending the job and the server")
        done = asyncio.run_coroutine_threadsafe(front.shutdown(), front.loop)
        try:
            done.result(SHUTDOWN_S)
        except Exception as err:  # noqa: BLE001 (leaving anyway)
            log.error("while stopping: %r", err)
        front.thread.join(3.0)
    front.sock.close()
    return 130 if stop.is_set() else (1 if front.error or front.failed else 0)
