"""The front's process (or thread): the port is taken first (a port in use is an error
before anything starts); uvicorn and the job's keeper (supervisor.py for a job the front
launches, in_job.py for the job this process is rank 0 of) share one event loop on a thread
of their own, with the request table and the console's data (console.py) they feed. For
`pipeinfer serve --ranks N` the main thread waits for SIGINT or SIGTERM, then ends every
request with 503, the job in order (every rank gone within 30 s) and the HTTP server."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import threading
from dataclasses import dataclass
from typing import Callable

import uvicorn

from ..config.serving import ServeConfig
from .app import Front, build_app
from .channel import reach_of
from .console import Console
from .launcher import Host, Launcher
from .metrics import ServiceMetrics
from .supervisor import Supervisor
from .table import Table
from .trace import FrontTrace

log = logging.getLogger(__name__)

SHUTDOWN_S = 28.0   # the job's orderly stop and the HTTP server's, together
STOP_WAIT_S = 3.0   # for the thread to close its connections and end


@dataclass(frozen=True)
class LaunchOptions:
    """The job the front launches and keeps running (`serve --ranks N`)."""
    ranks: int
    hosts: tuple[Host, ...] | None
    mpiexec: str | None
    max_restarts: int
    job_args: tuple[str, ...]
    stall_timeout: float = 60.0
    trace: str | None = None
    front_address: str | None = None   # how a head on another host reaches the front


# A job's keeper: made on the event loop from the request table, the metrics and the console.
Keeper = Callable[[Table, ServiceMetrics, Console], object]


class FrontThread:
    """uvicorn and the job's keeper on one event loop, on a thread of their own."""

    def __init__(self, options: ServeConfig, keeper: Keeper, what: str):
        self.options, self.keeper_of, self.what = options, keeper, what
        self.sock = listen_socket(options.host, options.port)
        self.port = self.sock.getsockname()[1]
        self.loop: asyncio.AbstractEventLoop | None = None
        self.started, self.error, self.failed = threading.Event(), None, False
        self.server: uvicorn.Server | None = None
        self.keeper = None
        self.thread = threading.Thread(target=self._run, name="front", daemon=True)
        self.thread.start()
        self.started.wait()

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as err:  # noqa: BLE001 (reported by whoever waits for it)
            self.error = err
        finally:
            self.started.set()

    async def _main(self) -> None:
        o = self.options
        self.loop = asyncio.get_running_loop()
        metrics, console = ServiceMetrics(), Console(o.model_name)
        table = Table(o.queue + o.parallel, metrics,   # (resumed requests: the keeper counts)
                      console=console)
        self.keeper = self.keeper_of(table, metrics, console)
        self.keeper.on_fatal = self._fatal
        self.keeper.on_state, self.keeper.on_pulse = console.state_changed, console.pulse
        console.keeper = self.keeper
        front = Front(self.keeper, table, metrics, o.model_name, o.api_key, console)
        config = uvicorn.Config(build_app(front, o.cors_origins), log_config=None,
                                log_level="warning", access_log=False, lifespan="off",
                                timeout_graceful_shutdown=1)
        self.server = uvicorn.Server(config)
        keeping = asyncio.ensure_future(self.keeper.run())
        self.started.set()
        log.info("listening on http://%s:%d (%s)", o.host, self.port, self.what)
        await self.server.serve(sockets=[self.sock])
        keeping.cancel()

    def _fatal(self) -> None:
        self.failed = True
        self.server.should_exit = True

    def alive(self) -> bool:
        return self.thread.is_alive()

    async def _shutdown(self) -> None:
        self.keeper.table.fail_all(503, "the server is shutting down")
        await asyncio.sleep(0.3)   # for the handlers to send it
        await self.keeper.stop()
        self.server.should_exit = True

    def stop(self, timeout: float = SHUTDOWN_S) -> None:
        """Every request ends 503, the job's keeper stops it, then the HTTP server."""
        if self.thread.is_alive() and self.loop is not None:
            done = asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop)
            try:
                done.result(timeout)
            except Exception as err:  # noqa: BLE001 (leaving anyway)
                log.error("while stopping: %r", err)
            self.thread.join(STOP_WAIT_S)
        self.sock.close()


def main(options: ServeConfig, launch: LaunchOptions) -> int:
    """`pipeinfer serve --ranks N`: the front's process, until SIGINT or SIGTERM (130) or it
    gives up on a job that cannot start (1)."""
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())

    def supervisor(table: Table, metrics: ServiceMetrics, console: Console) -> Supervisor:
        launcher = Launcher(launch.mpiexec, launch.ranks,
                            list(launch.hosts) if launch.hosts else None,
                            list(launch.job_args))
        hosts = [h.name for h in launch.hosts] if launch.hosts else None
        return Supervisor(launcher, table, metrics, launch.max_restarts,
                          reach_of(hosts, launch.front_address), stall_s=launch.stall_timeout,
                          trace=FrontTrace(launch.trace, also=console.record))

    front = FrontThread(options, supervisor, f"starting the job: {launch.ranks} ranks")
    while not stop.is_set() and front.thread.is_alive():
        stop.wait(0.5)
    if front.error is not None:
        log.error("the front failed: %r", front.error)
    if front.thread.is_alive():
        log.warning("stopping: ending the job and the server")
    front.stop()
    return 130 if stop.is_set() else (1 if front.error or front.failed else 0)


def listen_socket(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (ValueError saying why not)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as err:
        raise ValueError(f"cannot listen on {host}:{port}: {err.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as err:
        sock.close()
        raise ValueError(f"cannot listen on {host}:{port}: {err.strerror}") from None
    sock.set_inheritable(False)
    return sock
