"""uvicorn on a thread of its own, with its own event loop (the main thread is the head's, the
only one touching MPI). The socket is bound first, on the caller's thread, so that a port in
use is an error of the start, not of a thread nobody watches. uvicorn installs no signal
handlers off the main thread: the command handles SIGINT and SIGTERM and stops it here."""

from __future__ import annotations

import socket
import threading

import uvicorn

STOP_WAIT_S = 3.0      # for the thread to close its connections and end


class HttpThread:
    def __init__(self, app, host: str, port: int):
        self.sock = listen_socket(host, port)
        self.port = self.sock.getsockname()[1]
        config = uvicorn.Config(app, log_config=None, log_level="warning", access_log=False,
                                lifespan="off", timeout_graceful_shutdown=1)
        self.server = uvicorn.Server(config)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="http", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.server.run(sockets=[self.sock])
        except BaseException as err:  # noqa: BLE001 (seen by the head's loop: alive())
            self.error = err

    def alive(self) -> bool:
        return self.thread.is_alive()

    def stop(self) -> None:
        """Stop taking connections, finish the responses under way (briefly), end."""
        self.server.should_exit = True
        self.thread.join(STOP_WAIT_S)
        self.sock.close()


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
