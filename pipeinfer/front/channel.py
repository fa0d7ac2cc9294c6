"""The front's end of the channel to the job's head: a multiprocessing.connection Listener
(length-framed pickled messages, the peer authenticated by a random key the job gets in its
environment), on a Unix socket when the head runs on this host, else on TCP.

One listener for the front's whole life, so every job (the first and each relaunch) connects
to the same address; a job says which one it is in its first message, and a connection of a
job that has been replaced is closed. Receiving runs on threads; messages reach the front's
event loop through `deliver` (call_soon_threadsafe)."""

from __future__ import annotations

import logging
import os
import secrets
import socket
import tempfile
import threading
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection, Listener
from typing import Callable

log = logging.getLogger(__name__)

KEY_ENV = "PIPEINFER_FRONT_KEY"     # as serve/link.py reads it
JOB_ENV = "PIPEINFER_FRONT_JOB"     # which launch a job is


class Channel:
    def __init__(self, deliver: Callable[[int, tuple | None], None], tcp_host: str | None = None):
        """`deliver(job, message)` on a receiving thread; message None: that job's
        connection closed. `tcp_host`: listen on TCP there (a head on another host) instead
        of a Unix socket."""
        self.key = secrets.token_bytes(32)
        self.deliver = deliver
        if tcp_host is None:
            self.dir = tempfile.mkdtemp(prefix="pipeinfer-front-")
            self.listener = Listener(os.path.join(self.dir, "head"), "AF_UNIX", authkey=self.key)
            self.address = self.listener.address
        else:
            self.dir = None
            self.listener = Listener((tcp_host, 0), "AF_INET", authkey=self.key)
            host, port = self.listener.address
            self.address = f"{socket.getfqdn() if host in ('0.0.0.0', '') else host}:{port}"
        self._conns: dict[int, Connection] = {}
        self._lock = threading.Lock()
        self.current = -1   # the job whose connection is kept
        self._closed = False
        threading.Thread(target=self._accept, name="front-accept", daemon=True).start()

    def env(self, job: int) -> dict[str, str]:
        """What a job's processes need to connect (into their environment)."""
        return {KEY_ENV: self.key.hex(), JOB_ENV: str(job)}

    def _accept(self) -> None:
        while True:
            try:
                conn = self.listener.accept()
            except (OSError, EOFError, AuthenticationError):  # closed, or a peer without
                if self._closed:                              # the key
                    return
                continue
            threading.Thread(target=self._receive, args=(conn,), daemon=True).start()

    def _receive(self, conn: Connection) -> None:
        try:
            hello = conn.recv()
            job = int(hello[2])
        except (EOFError, OSError, IndexError, ValueError, TypeError):
            conn.close()
            return
        with self._lock:
            if job != self.current:
                conn.close()
                return
            self._conns[job] = conn
        self.deliver(job, hello)
        try:
            while True:
                self.deliver(job, conn.recv())
        except (EOFError, OSError):
            pass
        with self._lock:
            self._conns.pop(job, None)
        self.deliver(job, None)

    def expect(self, job: int) -> None:
        """From now on only `job` may connect; an older one's connection is closed."""
        with self._lock:
            self.current = job
            for old in [j for j in self._conns if j != job]:
                self._conns.pop(old).close()

    def send(self, job: int, message: tuple) -> bool:
        """To `job`'s head; False if it is not connected (any more)."""
        with self._lock:
            conn = self._conns.get(job)
            if conn is None:
                return False
            try:
                conn.send(message)
                return True
            except (OSError, ValueError):
                return False

    def close(self) -> None:
        self._closed = True
        with self._lock:
            for conn in self._conns.values():
                conn.close()
            self._conns.clear()
        self.listener.close()
        if self.dir is not None:
            for name in os.listdir(self.dir):
                os.unlink(os.path.join(self.dir, name))
            os.rmdir(self.dir)
