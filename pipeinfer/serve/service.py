"""One rank's part of `pipeinfer serve`: errors become one line and an exit status.

Rank 0 listens first (the port is taken before any model loads, and /health answers 503
while they load), then every rank starts the job as for `pipeinfer run`. The head then
generates requests on the main thread while uvicorn serves HTTP on another; the workers
evaluate their slices until the head shuts them down.

Endings: SIGINT or SIGTERM (on every rank under mpiexec, or the head alone) ends the requests
under way with 503, stops the HTTP server, takes the results still in flight and shuts the
workers down (they ignore the signals once started, to end in this order), within a few
seconds; if that takes over STOP_LIMIT_S, SIGALRM ends the head and the launcher the job. A
rank that fails
ends the requests with 503 naming it, and the whole job. A rank killed outright (SIGKILL) is
named by its supervisor, and the launcher ends the job: the head's supervisor dies, the head
gets JOB_LOST (engine/startup/supervisor.py), answers the requests under way and waiting with 503
(the job ended; the launcher's output names the rank, which the head cannot know) and ends.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import dataclass

from ..config.job import RunConfig
from ..engine.transport.backoff import IdleBackoff
from ..engine.startup.job import Job, StartFailed, describe
from ..engine.transport.mpi import Link, abort_job
from ..engine.startup import supervisor
from ..engine.startup.supervisor import JOB_LOST
from ..model.sampling import SamplingParams
from .app import Service, build_app, ready
from .bridge import Bridge, State
from .front_link import FrontLink
from .http_thread import HttpThread
from .loop import serve_requests
from .metrics import ServeMetrics

log = logging.getLogger(__name__)

FLUSH_S = 0.5   # for the HTTP thread to send the error answers before it stops
STOP_LIMIT_S = 20  # seconds an orderly stop may take (the ranks must be gone within 30)
SUPERVISOR_CHECK_S = 0.25


@dataclass(frozen=True)
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = 8080
    queue: int = 16
    api_key: str | None = None
    model_name: str = ""
    defaults: SamplingParams = SamplingParams()
    cors_origins: tuple[str, ...] = ("*",)
    cache_prompt: bool = True
    channel: str | None = None   # the front's address: no HTTP here (front_link.py)


def main(cfg: RunConfig, options: ServeOptions) -> int:
    """This rank's part of the server; its exit status."""
    rank = Link().rank
    service = Service(Bridge(options.queue), ServeMetrics(), options.model_name, cfg.n_ctx,
                      options.defaults, options.api_key, cfg.slots, options.cache_prompt)
    http: list = []   # the HTTP thread, or the link to the front
    if rank == 0:
        signal.signal(JOB_LOST, lambda signum, frame: threading.Thread(
            target=_job_lost, args=(service,), daemon=True).start())
        threading.Thread(target=_watch_supervisor, args=(service,), daemon=True).start()

    def listen() -> None:
        if options.channel is not None:
            http.append(FrontLink(options.channel))
            return
        http.append(HttpThread(build_app(service, options.cors_origins), options.host,
                               options.port))
        log.info("listening on http://%s:%d (loading the model)", options.host, http[0].port)

    try:
        job = Job.start(cfg, check=listen)
    except (StartFailed, KeyboardInterrupt) as err:
        for thread in http:
            if isinstance(thread, FrontLink):   # the front says why (no HTTP here)
                thread.send(("startfailed", str(err)))
                thread.close()
            else:
                thread.stop()
        if isinstance(err, KeyboardInterrupt):
            return _interrupted(rank)
        if rank == 0:
            log.error("%s", err)
        return 1
    if not job.is_head:
        for signum in (signal.SIGINT, signal.SIGTERM):  # the head ends the workers in order
            signal.signal(signum, signal.SIG_IGN)
        return job.serve()
    if isinstance(http[0], FrontLink):
        return _head_of_front(cfg, job, service, http[0])
    log.warning("serving without failover: a failed rank ends this server (`pipeinfer serve "
                "--ranks N`, not under mpiexec, starts a front that relaunches the job and "
                "resumes the requests)")
    return _head(cfg, job, service, http[0])


def _head(cfg: RunConfig, job: Job, service: Service, http: HttpThread) -> int:
    ready(service, job.head)
    log.info("%s", job.ready_line())
    log.info("serving %s on http://%s:%d", service.model_name, http.sock.getsockname()[0],
             http.port)
    try:
        serve_requests(job.head, service.bridge, service.metrics, lambda: _http_alive(http))
    except KeyboardInterrupt:
        _stop(job, service, http)
        return _interrupted(0)
    except Exception as err:  # a rank failed (or a bug): end every request and the job
        log.error("%s", describe(err, cfg.verbose))  # (the requests got 503 with it)
        time.sleep(FLUSH_S)
        http.stop()
        if job.link.size > 1:
            abort_job(1)  # workers may wait on a rank that is gone: end them all
        return 1
    return 0


def _head_of_front(cfg: RunConfig, job: Job, service: Service, link: FrontLink) -> int:
    """The head of a job the front started: requests come over the channel until the front
    asks to stop or goes away; then the job ends in order."""
    link.serve(service)
    ready(service, job.head)
    link.ready(service, job.statuses)
    log.info("%s", job.ready_line())
    try:
        job.head.setup.pipeline.on_progress = link.beat   # (the front's watchdog)
        serve_requests(job.head, service.bridge, service.metrics, link.alive)
    except KeyboardInterrupt:
        pass
    except Exception as err:  # a rank failed: the front was told (bridge.lost) and resumes
        log.error("%s", describe(err, cfg.verbose))
        link.close()
        if job.link.size > 1:
            abort_job(1)
        return 1
    _stop(job, service, None)
    link.close()
    return 0


def _watch_supervisor(service: Service) -> None:
    """JOB_LOST's handler runs on the main thread only once it is back in Python: a head
    inside a blocking MPI call to a rank that is gone would never get there (and the launcher
    would wait for its output). This thread notices the supervisor gone (a new parent) on
    its own, the MPI call having released the GIL."""
    parent = os.getppid()
    if supervisor.launcher_rank() is None or parent == 1:
        return   # no supervisor (not under a launcher, or PIPEINFER_NO_SUPERVISOR)
    while os.getppid() == parent:
        time.sleep(SUPERVISOR_CHECK_S)
    _job_lost(service)


def _job_lost(service: Service) -> None:
    """The launcher is ending the job (another rank died): every request under way or
    waiting gets 503 saying so, then the head ends without touching MPI (its peers are gone).
    On a thread of its own: the signal may land while the main thread holds the bridge."""
    message = ("the job ended: its launcher stopped this server because another rank failed "
               "or was killed (the launcher's output names it)")
    log.error("%s", message)
    service.bridge.fail(State.FAILED, message)
    time.sleep(FLUSH_S)
    os._exit(1)


def _http_alive(http: HttpThread) -> bool:
    if not http.alive():
        raise RuntimeError(f"the HTTP server stopped: {http.error or 'no reason given'}")
    return True


def _stop(job: Job, service: Service, http: HttpThread | None) -> None:
    """After an interrupt: 503 to the requests under way, then stop HTTP and the workers
    (which ignore the signals: they are ended here, in order). supervisor.interrupt's second
    interrupt is called off: this must not be cut short; if a rank keeps it from ending,
    SIGALRM ends the head after STOP_LIMIT_S, and the launcher the job."""
    signal.alarm(0)
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.alarm(STOP_LIMIT_S)
    try:
        service.bridge.fail(State.STOPPING, "the server is shutting down")
        if http is not None:
            time.sleep(FLUSH_S)
            http.stop()
        _drain(job.head.setup.pipeline)
        job.head.shutdown()
    except (KeyboardInterrupt, Exception) as err:  # noqa: BLE001 (leaving anyway)
        log.debug("while stopping: %r", err)
    signal.alarm(0)


def _drain(pipeline) -> None:
    """Take the results of an interrupted generation's runs still in flight (MPI must not
    end with messages to this rank unreceived)."""
    backoff = IdleBackoff()
    while pipeline.in_flight > 0:
        if pipeline.poll() is None:
            backoff.wait()


def _interrupted(rank: int) -> int:
    if rank == 0:
        log.warning("interrupted", extra={"fresh_line": True})
    return 130
