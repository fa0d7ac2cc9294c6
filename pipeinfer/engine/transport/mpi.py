"""MPI messaging for the pipeline: the only module that imports mpi4py.

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
from ...schedule.transaction import DecodeTx, KvOp, RunResult
from .wire import (HEAD, ResultFlag, Tag, TxType, decode_header, encode_kv_ops, encode_meta,
                   make_header)

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
# How often the head's polls for a result also look for another rank's error report (a
# probe of every rank, the dearest part of a poll); rarer where the reports wake the head.
ERROR_CHECK_S, ERROR_CHECK_WOKEN_S = 0.01, 0.1


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
        take the core from this rank before the rest is posted, and wait for it."""
        posted = []
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
        """The status of a waiting message from `source` (None: any rank), or None."""
        status = MPI.Status()
        source = MPI.ANY_SOURCE if source is None else source
        if self.comm.Iprobe(source=source, tag=int(tag), status=status):
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


class HeadTransport(Link):
    """The head's side of the pipeline (implements the scheduler's Transport protocol)."""

    def __init__(self, n_vocab: int, comm: Any = None, n_ranks: int | None = None,
                 chain: list[int] | None = None):
        super().__init__(comm)
        self.n_vocab = n_vocab
        self.n_ranks = n_ranks or self.size  # the pipeline's ranks (draft ranks follow them)
        chain = chain or list(range(self.n_ranks))
        self.stages = chain[1:]              # the ranks activations pass through, in order
        self._next_error_check = 0.0
        self.idle = [r for r in range(1, self.n_ranks) if r not in chain]  # left out
        self.first, self.last = self.stages[0], self.stages[-1]

    def send_decode(self, tx: DecodeTx, activations: np.ndarray) -> None:
        meta = encode_meta(tx)
        self.send(self.first, (decode_header(tx, meta_len=len(meta)), Tag.BEGIN),
                  (meta, Tag.DECODE_META),
                  (activations.astype(np.float32, copy=False).reshape(-1), Tag.ACTIVATIONS))

    def send_kv(self, ops: list[KvOp]) -> None:
        self.send(self.first, (make_header(TxType.KV, n_items=len(ops)), Tag.BEGIN),
                  (encode_kv_ops(ops), Tag.KV_OPS))

    def send_cancel(self, run_ids: list[int]) -> None:
        """To every worker at once, not relayed from the last: a relay is a worker's side
        thread, and a message it posts while its rank computes may wait for that rank's next
        call into MPI (tens of ms under MPICH's shared memory), while the head calls in all
        the time. A worker that has not reached a run yet skips it when it comes."""
        ids = np.array(run_ids, dtype=np.int64)
        for rank in self.stages:
            self.isend(ids, rank, Tag.CANCEL)

    def send_busy_probe(self) -> None:
        """Ask every worker for its busy seconds so far (after what it was sent before), its
        CPU seconds and resident memory (worker/loop.py PROBE_FIELDS)."""
        self.send(self.first, (make_header(TxType.BUSY), Tag.BEGIN),
                  (np.zeros(0, dtype=np.float64), Tag.BUSY))

    def poll_busy(self) -> np.ndarray | None:
        """The answer to a busy probe, if it is back: PROBE_FIELDS per worker, rank 1
        first, one flat array."""
        return self.recv_array(self.last, Tag.BUSY, np.float64, wait=False)

    def result_waiting(self) -> bool:
        return self.probe(self.last, Tag.RESULT) is not None

    @property
    def woken(self) -> bool:
        """Whether every other rank of the job wakes the head when it sends to it (results,
        errors, draft ranks' messages), so that the head's waits may sleep long."""
        return wakeup.woken_by(range(1, self.size))

    def poll_result(self) -> RunResult | None:
        """The next result if it is there; when none is, other ranks' errors (RankFailed) at
        most every ERROR_CHECK_S (ERROR_CHECK_WOKEN_S where every rank wakes the head)."""
        header = self.recv_array(self.last, Tag.RESULT, np.int64, wait=False)
        if header is None:
            now = time.monotonic()
            if now >= self._next_error_check:
                self._next_error_check = now + (ERROR_CHECK_WOKEN_S if self.woken
                                                else ERROR_CHECK_S)
                self.check_errors()
            return None
        run_id, n_rows, flags = int(header[1]), int(header[2]), ResultFlag(int(header[4]))
        if flags & ResultFlag.SKIPPED:
            return RunResult(run_id, None)
        if flags & ResultFlag.ARGMAX:
            return RunResult(run_id, None, self.recv_array(self.last, Tag.LOGITS, np.int32))
        rows = self.recv_array(self.last, Tag.LOGITS, np.float32)
        if flags & ResultFlag.STATES:
            return RunResult(run_id, None, states=rows.reshape(n_rows, -1))
        return RunResult(run_id, rows.reshape(n_rows, self.n_vocab))

    def shutdown(self) -> list[dict]:
        """Stop every worker and collect their statistics (rank order)."""
        self.isend(make_header(TxType.SHUTDOWN), self.first, Tag.BEGIN)
        self.send_cancel([CANCEL_END])
        for rank in self.idle:
            self.isend(make_header(TxType.SHUTDOWN), rank, Tag.BEGIN)
        stats = []
        for rank in range(1, self.n_ranks):
            backoff = Backoff()
            while self.probe(rank, Tag.STATS) is None:
                self.check_errors()  # a worker that fails now sends no statistics
                backoff.wait()
            stats.append(self.comm.recv(source=rank, tag=int(Tag.STATS)))
        self.flush()
        return stats


class WorkerLink(Link):
    """A worker's side: begin/payload from the previous rank, forward to the next, results and
    cancellations to and from the head."""

    def __init__(self, comm: Any = None, n_ranks: int | None = None,
                 chain: list[int] | None = None):
        super().__init__(comm)
        n_ranks = n_ranks or self.size  # the pipeline's ranks (draft ranks follow them)
        chain = chain or list(range(n_ranks))  # the ranks activations pass through
        i = chain.index(self.rank)
        self.prev = chain[i - 1]
        self.next = chain[i + 1] if i + 1 < len(chain) else None
        self.cancel_source = HEAD

    def poll_begin(self) -> np.ndarray | None:
        return self.recv_array(self.prev, Tag.BEGIN, np.int64, wait=False)

    def recv_payload(self, tag: Tag, dtype) -> np.ndarray:
        return self.recv_array(self.prev, tag, dtype)

    def forward(self, header: np.ndarray, *payload: tuple[np.ndarray, Tag]) -> None:
        self.send(self.next, (header, Tag.BEGIN), *payload)

    def send_result(self, run_id: int, logits: np.ndarray | None, argmax_only: bool,
                    states: bool = False) -> None:
        """Send a run's logits to the head (only each row's argmax if `argmax_only`), or its
        hidden states (`states`: an embedding's run)."""
        n_rows = 0 if logits is None else logits.shape[0]
        if logits is None:
            flags, payload = ResultFlag.SKIPPED, None
        elif states:
            flags, payload = ResultFlag.STATES, logits.reshape(-1)
        elif argmax_only:
            flags, payload = ResultFlag.ARGMAX, np.argmax(logits, axis=1).astype(np.int32)
        else:
            flags, payload = ResultFlag.NONE, logits.reshape(-1)
        messages = [(make_header(TxType.LOGITS, run_id, n_rows, flags=int(flags)), Tag.RESULT)]
        if payload is not None:
            messages.append((payload, Tag.LOGITS))
        self.send(HEAD, *messages)

    def poll_cancel(self) -> np.ndarray | None:
        return self.recv_array(self.cancel_source, Tag.CANCEL, np.int64, wait=False)

    def send_stats(self, stats: dict) -> None:
        self.isend_obj(stats, HEAD, Tag.STATS)

    def send_busy(self, busy: np.ndarray) -> None:
        """The last rank: a busy probe's answer to the head."""
        self.isend(busy, HEAD, Tag.BUSY)

