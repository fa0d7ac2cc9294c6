"""The job's end of the channel to the front, on rank 0: a multiprocessing Connection
(length-framed pickled tuples). Launched by a front (`pipeinfer serve --ranks N`), it is a
socket to the front's address, the peer authenticated with the key the front put in the
job's environment; in a job launched by someone else (`mpiexec -n N pipeinfer serve`) it is
one end of a pipe whose other end the front in this same process holds.

    front -> job   ("start", rid, kind, body, resumed, done)   a request (kind: "chat",
                                       "completions" or "embeddings"); `resumed[i]`: the
                                       tokens choice i already sent, `done`: choices ended
                   ("cancel", rid)     its client went away
                   ("call", rid, name, body)   tokenize / detokenize / metrics
                   ("stop",)           end the job in order
    job -> front   ("hello", pid, job, host) at once, ("ready", info) once the model is loaded
                                       (info: the ranks, slots, context, and what each rank
                                       holds: job/layout.py)
                   ("beat", n)         the pipeline worked (n: runs evaluated on the head
                                       and results taken so far): at most every BEAT_S
                                       while it does, so that a slow job (a long prefill)
                                       is not taken for a hung one by the front's watchdog
                                       (--stall-timeout); a stopped rank returns nothing,
                                       the runs in flight reach their cap, and the beats stop
                   ("accepted", rid, ask) or ("refused", rid, status, message, kind, param)
                   ("event", rid, choice, Piece | Done | Embedded | Failed)
                   ("answer", rid, result) or ("refused", rid, ...) for a call
                   ("stats", totals)   the job's totals, after every generation (stats.py)
                   ("pulse", figures)  at most once a second while the job works: the
                                       ranks' busy and CPU seconds and memory, runs in
                                       flight, totals with the generations under way
                                       (pulse.py; the front's console shows them)
                   ("lost", message)   the job is ending (a rank failed)
                   ("startfailed", message)   the job could not start

Messages are taken on a thread of their own (intake.py handles them); events are sent from
the head's thread.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from multiprocessing.connection import Client, Connection
from typing import Callable

log = logging.getLogger(__name__)

KEY_ENV = "PIPEINFER_FRONT_KEY"   # the channel's key (hex), from the front
JOB_ENV = "PIPEINFER_FRONT_JOB"   # which of the front's launches this job is
BEAT_S = 0.5                      # at most one beat this often
CONNECT_WAIT_S = 60.0             # a front on another host: how long to keep trying
ATTEMPT_S = 5.0


def connect(address: str, wait_s: float = CONNECT_WAIT_S) -> Connection:
    """The channel to a front listening at `address` (a Unix socket path or host:port). Over
    TCP, attempts of ATTEMPT_S each with a fresh socket (Client's own connect waits out the
    kernel's SYN retries, minutes, on one) until one gets through or `wait_s` has passed: a
    first job's head on an emulated node once got no answer at all (cause not found), and a
    front on another host may be unreachable for a moment as the job starts."""
    key = bytes.fromhex(os.environ.get(KEY_ENV, ""))
    if address.startswith("/"):
        return Client(address, family="AF_UNIX", authkey=key)
    host, _, port = address.rpartition(":")
    target = (host.strip("[]"), int(port))
    deadline = time.monotonic() + wait_s
    while True:
        try:   # (the front's listener drops this probe connection: it has no key)
            socket.create_connection(target, timeout=ATTEMPT_S).close()
            return Client(target, family="AF_INET", authkey=key)
        except OSError as err:
            if time.monotonic() >= deadline:
                raise
            log.warning("cannot reach the front at %s yet (%s): trying again", address,
                        err.strerror or err)
            time.sleep(1.0)


class FrontLink:
    def __init__(self, conn: Connection):
        self.conn = conn
        self._lock = threading.Lock()
        self.closed = threading.Event()   # the front went away or asked to stop
        self._beat = (0, 0.0)   # results counted at the last beat, and when
        self.send(("hello", os.getpid(), int(os.environ.get(JOB_ENV, "0")),
                   socket.gethostname()))

    def send(self, message: tuple) -> None:
        with self._lock:
            try:
                self.conn.send(message)
            except (OSError, ValueError):   # the front is gone: the job ends (closed)
                self.closed.set()

    def listen(self, handle: Callable[[tuple], None]) -> None:
        """The front's messages to `handle`, on a thread of its own, until "stop" or the
        channel closes."""
        threading.Thread(target=self._receive, args=(handle,), name="front",
                         daemon=True).start()

    def _receive(self, handle: Callable[[tuple], None]) -> None:
        try:
            while True:
                message = self.conn.recv()
                if message[0] == "stop":
                    break
                handle(message)
        except (EOFError, OSError):
            log.info("the front closed the channel: ending the job")
        except Exception as err:  # a bug: end the job rather than leave the front waiting
            log.error("front channel: %r", err, exc_info=err)
        self.closed.set()

    def ready(self, statuses, slots: int, n_ctx: int, layout: dict | None = None) -> None:
        """The job takes requests: its ranks (rank, host, pid), slots and context, and what
        each rank holds (job/layout.py) for the console."""
        self.send(("ready", {"statuses": [list(s[:3]) for s in statuses], "slots": slots,
                             "n_ctx": n_ctx, **(layout or {})}))

    def alive(self) -> bool:
        return not self.closed.is_set()

    def beat(self, progress: int) -> None:
        """After each run the head's pipeline evaluated or took back (Pipeline.on_progress,
        on the head's thread; a clock read): a beat to the front if BEAT_S has passed."""
        now = time.monotonic()
        if now - self._beat[1] >= BEAT_S:
            self._beat = (progress, now)
            self.send(("beat", progress))

    def close(self) -> None:
        self.closed.set()
        try:
            self.conn.close()
        except OSError:
            pass
