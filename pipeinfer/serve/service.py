"""One rank's part of `pipeinfer serve`: errors become one line and an exit status.

Rank 0 first opens the channel to the front: to the front that launched the job (its
address in --channel), or, in a job someone else launched (`mpiexec -n N pipeinfer serve`,
`srun`), to a front started here on a thread of its own, whose HTTP port is taken before any
model loads (/health answers 503 meanwhile). Then every rank starts the job as for
`pipeinfer run`. The head takes the front's requests (intake.py) and generates them on the
main thread (loop.py); the workers evaluate their slices until the head shuts them down.

Endings: the front's "stop", or SIGINT or SIGTERM in a job launched by someone else, ends the
job in order: the results still in flight are taken and the workers shut down (they ignore
the signals once started, to end in this order), within a few seconds; if that takes over
STOP_LIMIT_S, SIGALRM ends the head and the launcher the job. A rank that fails ends the job;
the front is told why (it resumes the requests on a new job, or without failover answers
them 503 with the reason). A rank killed outright (SIGKILL) is named by its supervisor and
the launcher ends the job: the head's supervisor dies, the head gets JOB_LOST
(job/supervisor.py), tells the front (the launcher's output names the rank, which
the head cannot know) and ends.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
import time
from typing import TYPE_CHECKING

from ..config.job import JobConfig
from ..job import supervisor
from ..job.layout import layout
from ..job.roles import Job, StartFailed, describe
from ..job.supervisor import JOB_LOST
from ..engine.transport.backoff import IdleBackoff
from ..engine.transport.mpi import LOST_PEER, Link, abort_job
from ..config.serving import ServeConfig
from .bridge import Bridge
from .intake import open_intake
from .link import FrontLink, connect
from .loop import serve_requests

if TYPE_CHECKING:   # (imported where used: a job under a front has no HTTP server)
    from ..front.in_job import InJobFront

log = logging.getLogger(__name__)

FLUSH_S = 0.5   # for the front to send the error answers before this process ends
STOP_LIMIT_S = 20  # seconds an orderly stop may take (the ranks must be gone within 30)
SUPERVISOR_CHECK_S = 0.25
LOST = f"{LOST_PEER}; its launcher stopped this server"


class Rank0:
    """Rank 0's ends of the service: the link to the front and, in a job launched by someone
    else, that front itself."""

    def __init__(self, cfg: JobConfig, options: ServeConfig):
        self.cfg, self.options = cfg, options
        self.link: FrontLink | None = None
        self.front: InJobFront | None = None
        self.bridge: Bridge | None = None

    def open(self) -> None:
        """Before anything loads (Job.start's check): the channel, and the front's port."""
        options = self.options
        if options.channel is not None:
            self.link = FrontLink(connect(options.channel))
            return
        from ..front.in_job import InJobFront   # uvicorn, starlette: only for this front
        front_end, job_end = multiprocessing.Pipe()
        self.front = InJobFront(options, front_end)
        self.link = FrontLink(job_end)

    def start_failed(self, message: str) -> None:
        if self.link is not None:   # the front says why (in the job's log too)
            self.link.send(("startfailed", message))
        self.close(flush=self.front is not None)

    def lost(self, message: str) -> None:
        """The launcher is ending the job: the front is told, then this process ends."""
        log.error("%s", message)
        if self.bridge is not None:
            self.bridge.fail(message)
        elif self.link is not None:
            self.link.send(("lost", message))
        time.sleep(FLUSH_S)
        os._exit(1)

    def close(self, flush: bool = False) -> None:
        if flush:
            time.sleep(FLUSH_S)
        if self.front is not None:
            self.front.stop()
        if self.link is not None:
            self.link.close()


def main(cfg: JobConfig, options: ServeConfig) -> int:
    """This rank's part of the server; its exit status."""
    rank = Link().rank
    ends = Rank0(cfg, options)
    if rank == 0:
        signal.signal(JOB_LOST, lambda signum, frame: threading.Thread(
            target=ends.lost, args=(LOST,), daemon=True).start())
        threading.Thread(target=_watch_supervisor, args=(ends,), daemon=True).start()
    try:
        job = Job.start(cfg, check=ends.open)
    except (StartFailed, KeyboardInterrupt) as err:
        ends.start_failed(str(err))
        if isinstance(err, KeyboardInterrupt):
            return _interrupted(rank)
        if rank == 0:
            log.error("%s", err)
        return 1
    if not job.is_head:
        for signum in (signal.SIGINT, signal.SIGTERM):  # the head ends the workers in order
            signal.signal(signum, signal.SIG_IGN)
        return job.serve()
    if ends.front is not None:
        log.warning("serving without failover: a failed rank ends this server (`pipeinfer "
                    "serve --ranks N`, not under a launcher, starts a front that relaunches "
                    "the job and resumes the requests)")
    return _head(cfg, job, ends)


def _head(cfg: JobConfig, job: Job, ends: Rank0) -> int:
    """Requests from the front until it asks to stop or goes away (or, without a front
    process, until SIGINT or SIGTERM); then the job ends in order."""
    link = ends.link
    ends.bridge, stats = open_intake(link, ends.options, cfg, job.head)
    bridge = ends.bridge
    link.ready(job.statuses, cfg.slots, cfg.n_ctx, layout(job))
    log.info("%s", job.ready_line())
    interrupted = False
    try:
        job.head.setup.pipeline.on_progress = link.beat   # (the front's watchdog)
        serve_requests(job.head, bridge, stats, lambda: _keep_going(ends))
    except KeyboardInterrupt:
        interrupted = True
    except Exception as err:  # a rank failed: the front was told (bridge.fail)
        log.error("%s", describe(err, cfg.output.verbose))
        ends.close(flush=True)
        if job.link.size > 1:
            abort_job(1)  # workers may wait on a rank that is gone: end them all
        return 1
    _stop(job, ends)
    return _interrupted(0) if interrupted and ends.front is not None else 0


def _keep_going(ends: Rank0) -> bool:
    if ends.front is not None and not ends.front.alive():
        raise RuntimeError(f"the HTTP server stopped: {ends.front.error or 'no reason given'}")
    return ends.link.alive()


def _watch_supervisor(ends: Rank0) -> None:
    """JOB_LOST's handler runs on the main thread only once it is back in Python: a head
    inside a blocking MPI call to a rank that is gone would never get there (and the launcher
    would wait for its output). This thread notices the supervisor gone (a new parent) on
    its own, the MPI call having released the GIL."""
    parent = os.getppid()
    if supervisor.launcher_rank() is None or parent == 1:
        return   # no supervisor (not under a launcher, or PIPEINFER_NO_SUPERVISOR)
    while os.getppid() == parent:
        time.sleep(SUPERVISOR_CHECK_S)
    ends.lost(LOST)


def _stop(job: Job, ends: Rank0) -> None:
    """The front's answers first (every request under way ends 503: the server is shutting
    down), then the workers (which ignore the signals: they are ended here, in order).
    supervisor.interrupt's second interrupt is called off: this must not be cut short; if a
    rank keeps it from ending, SIGALRM ends the head after STOP_LIMIT_S, and the launcher
    the job."""
    signal.alarm(0)
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.alarm(STOP_LIMIT_S)
    try:
        ends.close()
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
