"""The front's end of the channel to the job's head: a multiprocessing.connection Listener
(length-framed pickled messages, the peer authenticated by a random key the job gets in its
environment), on a Unix socket when every rank runs on this host, else on TCP: listening on
every interface, on a free port, the head connecting to the address `reach` names (multiprocessing
authenticates both ends with the key, HMAC challenges, before a message is read).

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
    def __init__(self, deliver: Callable[[int, tuple | None], None], reach: str | None = None):
        """`deliver(job, message)` on a receiving thread; message None: that job's
        connection closed. `reach`: the name or address of this host by which a head on
        another host connects (TCP); None: a Unix socket."""
        self.key = secrets.token_bytes(32)
        self.deliver = deliver
        if reach is None:
            self.dir = tempfile.mkdtemp(prefix="pipeinfer-front-")
            self.listener = Listener(os.path.join(self.dir, "head"), "AF_UNIX", authkey=self.key)
            self.address = self.listener.address
        else:
            self.dir = None
            self.listener = Listener(("0.0.0.0", 0), "AF_INET", authkey=self.key)
            self.address = f"{reach}:{self.listener.address[1]}"
            log.info("the job's head reaches the front at %s (TCP, authenticated)",
                     self.address)
        self._conns: dict[int, Connection] = {}
        self._lock = threading.Lock()
        self.current = -1   # the job whose connection is kept
        self._closed = False
        threading.Thread(target=self._accept, name="front-accept", daemon=True).start()

    @property
    def tcp(self) -> bool:
        return self.dir is None

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


def reach_of(hosts: list[str] | None, given: str | None) -> str | None:
    """How a head reaches the front: `given` (--front-address) if set; else None (a Unix
    socket) when every host is this one (or none is named), else this host's name."""
    if given:
        return given
    if not hosts or all(is_this_host(h) for h in hosts):
        return None
    name = socket.getfqdn()   # ("localhost" where /etc/hosts maps the name to 127.0.1.1)
    return socket.gethostname() if name.startswith("localhost") else name


def is_this_host(name: str) -> bool:
    return name in ("localhost", "127.0.0.1", "::1", socket.gethostname(), socket.getfqdn())
