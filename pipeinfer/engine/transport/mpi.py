"""MPI messaging for the pipeline: the only module that imports mpi4py. A rank's Link (sends,
receives, start-up collectives), other ranks' errors and tearing a job down; the head's and
the workers' sides of the pipeline build on it (head_transport.py, worker_link.py).

Sends are non-blocking with buffers owned until completion. Nothing here waits in a blocking
MPI call: on a box with fewer cores than ranks, MPI's busy-waiting would steal the core a
computing rank needs, so waits poll with Iprobe/Test and back off with short sleeps, which a
wake-up from the sender ends (engine/transport/wakeup.py; every send wakes its destination).
"""

from __future__ import annotations

import signal
import socket
import sys
import threading
import time
from typing import Any

import numpy as np

from . import wakeup
from .backoff import Backoff, ProgressPace
from .wakeup import Channel
from .wire import HEAD, Tag

# Importing mpi4py.MPI runs MPI_Init, which waits for every rank while holding the GIL: no
# Python signal handler runs meanwhile, and a rank that Ctrl-C ended before it got there would
# be waited for forever. So a rank interrupted in MPI_Init ends at once (SIGINT's default).
try:
    _sigint = signal.signal(signal.SIGINT, signal.SIG_DFL)
except ValueError:  # not the main thread
    _sigint = None
try:
    from mpi4py import MPI
finally:
    if _sigint is not None:
        signal.signal(signal.SIGINT, _sigint)

# The last message on every cancellation channel (the head to each worker): a worker ends
# only after it, so no cancellation is ever left in flight to a rank that is gone.
CANCEL_END = -1
# A receive of at least this many bytes wakes its sender every LARGE_RECV_WAKE_S until the data
# is in: past MPICH's eager limit it moves only while the sender calls into MPI, and a sender
# whose sends have waited long calls in rarely (backoff.ProgressPace).
LARGE_MESSAGE_BYTES = 16 * 1024
LARGE_RECV_WAKE_S = 200e-6


def _wake(dest: int, tag: Tag) -> None:
    wakeup.notify(dest, Channel.CANCEL if tag == Tag.CANCEL else Channel.MAIN)


def wake_sender(rank: int) -> None:
    """Wake `rank`'s waiting threads (a computing worker's cancel watcher, an idle rank's
    loop): the one asleep calls into MPI and moves the message this rank is receiving."""
    for channel in Channel:
        wakeup.notify(rank, channel)


class RankFailed(RuntimeError):
    """Another rank reported a failure, or the job is being torn down."""

    def __init__(self, rank: int, message: str, host: str | None = None):
        super().__init__(f"rank {rank}" + (f" ({host})" if host else "") + f": {message}")
        self.rank, self.host = rank, host


# What an MPI call raises when a peer is gone (killed, its host lost): the head's loop meets
# it before the launcher has ended the job, and says so (job/roles.py's describe).
MPI_ERRORS = (MPI.Exception,)
LOST_PEER = ("the job ended: another rank failed or was killed (the launcher's output "
             "names it)")


def first_failure(statuses) -> str | None:
    """The message of the first failed rank in gathered statuses (rank, host, _, error,
    ...): rank 0's as it is, another's prefixed with its rank and host; None if none."""
    for rank, host, _, error, *_ in statuses:
        if error:
            return error if rank == 0 else f"rank {rank} ({host}): {error}"
    return None


def world() -> tuple[int, int]:
    comm = MPI.COMM_WORLD
    return comm.Get_rank(), comm.Get_size()


def hostname() -> str:
    return socket.gethostname()


ABORT_GRACE_S = 0.2


def abort_job(code: int = 1) -> None:
    """Tear the whole job down (used only when a rank cannot report an error in order). The
    launcher may drop output it has not forwarded yet when the abort reaches it, so the
    message just printed gets a moment to go through first."""
    sys.stdout.flush()
    sys.stderr.flush()
    time.sleep(ABORT_GRACE_S)
    MPI.COMM_WORLD.Abort(code)


class Link:
    """Point-to-point messaging of one rank."""

    def __init__(self, comm: Any = None):
        self.comm = comm or MPI.COMM_WORLD
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self._pending: list[tuple[Any, Any]] = []
        self._pace = ProgressPace()
        self._lock = threading.Lock()
        self._posting = threading.Lock()   # one thread's messages of a `send` at a time

    # --- collectives used only at start-up and shutdown --------------------------------------
    # Blocking collectives spin while ranks wait for a slower one (the head reads the tokenizer
    # after loading its stage): a polite barrier first, so the collective itself is quick.
    def gather(self, obj: Any) -> list[Any] | None:
        self.barrier()
        return self.comm.gather(obj, root=HEAD)

    def bcast(self, obj: Any) -> Any:
        self.barrier()
        return self.comm.bcast(obj, root=HEAD)

    def agree(self, status: tuple) -> tuple[list | None, str | None]:
        """Collective: every rank's `status` (rank, host, _, error, ...) gathered on the head,
        and on every rank the first failure's message (first_failure; None: all well)."""
        statuses = self.gather(status)
        return statuses, self.bcast(first_failure(statuses) if self.rank == HEAD else None)

    def allgather(self, obj: Any) -> list[Any]:
        self.barrier()
        return self.comm.allgather(obj)

    def sleep(self, seconds: float, channel: Channel = Channel.MAIN) -> bool:
        """A back-off's sleep that also keeps this link's sends moving (shortened while any is
        incomplete: backoff.ProgressPace); True if a wake-up ended it."""
        with self._lock:
            self._pending = [(r, b) for r, b in self._pending if not r.Test()]
            if self._pending:
                seconds = min(seconds, self._pace.take())
        woken = wakeup.sleep(seconds, channel)
        if woken:
            self._pace.reset()  # (a float's store: no lock needed)
        return woken

    def barrier(self) -> None:
        """MPI barrier that waits with Test and sleeps instead of spinning."""
        req = self.comm.Ibarrier()
        backoff = Backoff(limit=2e-3)
        while not req.Test():
            backoff.wait()

    # --- sends ------------------------------------------------------------------------------
    def isend(self, buf: np.ndarray, dest: int, tag: Tag) -> None:
        self.send(dest, (buf, tag))

    def send(self, dest: int, *messages: tuple[np.ndarray, Tag]) -> None:
        """Post `messages` to `dest` in order, then wake it once: woken earlier, it could
        take the core from this rank before the rest is posted, and wait for it. The
        messages of one call are posted together: another thread's (a worker's background
        runs) go before or after them, never between, as the receiver takes a transaction's
        messages in order."""
        posted = []
        with self._posting:
            for buf, tag in messages:
                buf = np.ascontiguousarray(buf)
                posted.append((self.comm.Isend(buf, dest=dest, tag=int(tag)), buf))
        with self._lock:
            self._pending += posted
            self._pace.reset()
            self._reap_locked()
        _wake(dest, messages[0][1])

    def isend_tracked(self, buf: np.ndarray, dest: int, tag: Tag):
        """Send `buf` without waiting; a function that says whether the send has completed
        (the caller keeps `buf` alive until then, and bounds how many it has in flight)."""
        req = self.comm.Isend(buf, dest=dest, tag=int(tag))
        _wake(dest, tag)
        return req.Test

    def isend_obj(self, obj: Any, dest: int, tag: Tag) -> None:
        req = self.comm.isend(obj, dest=dest, tag=int(tag))
        with self._lock:
            self._pending.append((req, obj))
        _wake(dest, tag)

    def _reap_locked(self) -> None:
        if len(self._pending) > 8:
            self._pending = [(r, b) for r, b in self._pending if not r.Test()]

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait (politely) for every send to complete; False on timeout."""
        deadline, backoff = time.monotonic() + timeout, Backoff(limit=1e-3)
        while True:
            with self._lock:
                self._pending = [(r, b) for r, b in self._pending if not r.Test()]
                if not self._pending:
                    return True
            if time.monotonic() > deadline:
                return False
            backoff.wait()

    # --- receives ---------------------------------------------------------------------------
    def probe(self, source: int | None, tag: Tag) -> MPI.Status | None:
        """The status of a waiting message from `source` (None: any rank), or None.

        Asks twice: MPICH's Iprobe, finding nothing, makes progress (which may take in the
        very message asked for) and answers without looking again. Once is what a poll
        right after a wake-up would see, so every message would cost its receiver a turn
        more; a second look costs a few microseconds."""
        status = MPI.Status()
        source = MPI.ANY_SOURCE if source is None else source
        if (self.comm.Iprobe(source=source, tag=int(tag), status=status)
                or self.comm.Iprobe(source=source, tag=int(tag), status=status)):
            return status
        return None

    def recv_array(self, source: int, tag: Tag, dtype, wait: bool = True) -> np.ndarray | None:
        """Receive one array message (its length from the probe); None if `wait` is False and
        nothing is there."""
        status = self.probe(source, tag)
        if status is None and not wait:
            return None
        backoff = Backoff()
        while status is None:
            backoff.wait()
            status = self.probe(source, tag)
        n_bytes, source = status.Get_count(MPI.BYTE), status.Get_source()
        buf = np.empty(n_bytes // np.dtype(dtype).itemsize, dtype=dtype)
        if n_bytes < LARGE_MESSAGE_BYTES:
            self.comm.Recv(buf, source=source, tag=int(tag))
            return buf
        req, woken = self.comm.Irecv(buf, source=source, tag=int(tag)), 0.0
        while not req.Test():  # (spinning, as a blocking receive would, while it moves)
            if time.monotonic() - woken >= LARGE_RECV_WAKE_S:
                wake_sender(source)
                woken = time.monotonic()
        return buf

    def recv_into(self, buf: np.ndarray, source: int, tag: Tag) -> int:
        """Receive one message into `buf` (a non-blocking receive completed politely, never a
        spinning wait); the number of bytes received."""
        req = self.comm.Irecv(buf, source=source, tag=int(tag))
        status, backoff = MPI.Status(), Backoff(limit=1e-3)
        while not req.Test(status):
            backoff.wait()
        return status.Get_count(MPI.BYTE)

    def recv_obj(self, source: int, tag: Tag) -> Any:
        """Receive one pickled object, waited for with short sleeps."""
        backoff = Backoff(limit=1e-3)
        while self.probe(source, tag) is None:
            backoff.wait()
        return self.comm.recv(source=source, tag=int(tag))

    def poll_obj(self, source: int, tag: Tag) -> tuple[int, Any] | None:
        """(sender, object) of a waiting pickled message from `source` (None: any rank),
        else None."""
        status = self.probe(source, tag)
        if status is None:
            return None
        sender = status.Get_source()
        return sender, self.comm.recv(source=sender, tag=int(tag))

    def check_errors(self) -> None:
        """Raise RankFailed if any rank has reported an error."""
        status = self.probe(MPI.ANY_SOURCE, Tag.ERROR)
        if status is not None:
            host, message = self.comm.recv(source=status.Get_source(), tag=int(Tag.ERROR))
            raise RankFailed(status.Get_source(), str(message), host)

    def report_error(self, message: str) -> None:
        self.isend_obj((hostname(), message), HEAD, Tag.ERROR)
