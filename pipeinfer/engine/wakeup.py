"""Waking a waiting rank when a message is sent to it, without spinning (issue 34).

MPICH's blocking calls busy-poll (DESIGN.md section 9), so pipeinfer's ranks wait by probing
and sleeping between probes, and a message that arrives waits for the next probe: up to the
sleep's ceiling per pipeline hop, while every probe of an idle rank costs CPU that a rank
sharing its core needs. Beside MPI, each process has one Unix datagram socket per channel; a
rank that posts a message to another also sends it an empty datagram on the message's
channel, and a waiting rank sleeps in select() on its channel's socket (the timeout is its
back-off sleep), so it wakes when the message is there, and costs nothing while nothing comes.

Channels: MAIN (everything but cancellations) and CANCEL (a worker's cancel watcher waits on
it while the main thread computes). A channel is waited on by one thread at a time: two
waiters on one socket could take each other's wake-up (a lost wake-up costs only latency: the
wait still ends at its timeout).

The sockets are files in a private temporary directory, so they reach the processes of the
same kernel, also across the network namespaces of experiments/cluster.py, and nothing on
other hosts. Which ranks can wake which is checked at start-up (`greet`, `heard`): every rank
greets each rank of its host on both channels, and a pair whose greeting did not arrive has
no wake-ups; waits on such a pair probe as before. Wake-ups never carry data: a lost or
spurious one changes when a rank looks, not what it finds.
"""

from __future__ import annotations

import atexit
import enum
import glob
import os
import select
import shutil
import socket
import tempfile
import time
from typing import Iterable

BOOT_ID = "/proc/sys/kernel/random/boot_id"
DRAIN_MAX = 256  # datagrams read per wake-up at most (more means a busy sender: look anyway)


class Channel(enum.IntEnum):
    MAIN = 0
    CANCEL = 1


# Names the machine a rank stands for where that is not its kernel: experiments/cluster.py
# sets it per emulated node, so that ranks of different "machines" do not wake each other
# through this kernel's sockets, as ranks on real machines cannot.
HOST_VAR = "PIPEINFER_HOST_ID"


def host_key() -> str:
    """Names this kernel: ranks with equal keys can reach each other's socket files."""
    try:
        with open(BOOT_ID) as f:
            boot = f.read().strip()
    except OSError:
        boot = "?"
    return f"{socket.gethostname()}/{boot}/{os.environ.get(HOST_VAR, '')}"


class Wakeups:
    """This process's wake-up sockets and the paths of the peers it can wake."""

    def __init__(self, rank: int):
        self.rank = rank
        self.dir = tempfile.mkdtemp(prefix=f"pipeinfer-wake-r{rank}-")
        self.paths = tuple(os.path.join(self.dir, ch.name.lower()) for ch in Channel)
        self._socks: list[socket.socket] = []
        try:
            for path in self.paths:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                self._socks.append(sock)
                sock.bind(path)
                sock.setblocking(False)
            self._out = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._out.setblocking(False)
        except OSError:
            self.close()
            raise
        self._peers: dict[int, tuple[str, ...]] = {}  # rank -> its channels' paths
        self.wakes_from: frozenset[int] = frozenset()  # ranks whose greetings arrived

    def address(self) -> tuple[str, tuple[str, ...]]:
        """What the other ranks need to wake this one (exchanged at start-up)."""
        return host_key(), self.paths

    # --- start-up --------------------------------------------------------------------------
    def greet(self, table: list[tuple[str, tuple[str, ...]]]) -> None:
        """Given every rank's address (rank order), greet each rank on this host on every
        channel; the ranks whose sockets took the greeting become this rank's peers."""
        mine = host_key()
        for rank, entry in enumerate(table):
            if entry is None or rank == self.rank or entry[0] != mine:
                continue
            paths = entry[1]
            try:
                for path in paths:
                    self._out.sendto(str(self.rank).encode(), path)
            except OSError:
                continue  # not reachable from here (another mount namespace, ...)
            self._peers[rank] = tuple(paths)

    def heard(self) -> frozenset[int]:
        """After every rank greeted (a barrier): the ranks heard on every channel, i.e. the
        ranks that can wake this one. Clears the sockets."""
        heard = [set(self._drain(sock)) for sock in self._socks]
        self.wakes_from = frozenset(set.intersection(*heard)) if heard else frozenset()
        return self.wakes_from

    # --- use -------------------------------------------------------------------------------
    def can_wake(self, rank: int) -> bool:
        return rank in self._peers

    def notify(self, rank: int, channel: Channel = Channel.MAIN) -> None:
        """Wake `rank` if it waits on `channel` (nothing if it cannot be woken from here)."""
        paths = self._peers.get(rank)
        if paths is None:
            return
        try:
            self._out.sendto(b"", paths[channel])
        except BlockingIOError:
            pass  # its queue is full of wake-ups already
        except OSError:
            self._peers.pop(rank, None)  # gone (the job is ending): stop trying

    def wake_self(self, channel: Channel = Channel.MAIN) -> None:
        """Wake this process's own waiter on `channel` (from another of its threads)."""
        try:
            self._out.sendto(b"", self.paths[channel])
        except OSError:
            pass

    def wait(self, timeout: float, channel: Channel = Channel.MAIN) -> bool:
        """Sleep until a wake-up on `channel` or `timeout` seconds; True if woken (the
        channel's pending wake-ups are consumed)."""
        if not self._socks:  # closed (shutdown)
            time.sleep(max(0.0, timeout))
            return False
        sock = self._socks[channel]
        try:
            ready, _, _ = select.select([sock], [], [], max(0.0, timeout))
        except (OSError, ValueError):  # closed meanwhile (shutdown): sleep all the same
            time.sleep(max(0.0, timeout))
            return False
        if not ready:
            return False
        for _ in self._drain(sock):
            pass
        return True

    def _drain(self, sock: socket.socket) -> Iterable[int]:
        """Read the waiting datagrams; yields the sender rank of each greeting among them."""
        for _ in range(DRAIN_MAX):
            try:
                data = sock.recv(32)
            except (BlockingIOError, OSError):
                return
            if data:
                try:
                    yield int(data)
                except ValueError:
                    pass

    def close(self) -> None:
        """Close the sockets and remove their files. Safe to call twice."""
        for sock in self._socks + [getattr(self, "_out", None)]:
            if sock is not None:
                sock.close()
        self._socks = []
        shutil.rmtree(self.dir, ignore_errors=True)


# The process's wake-ups once connected (`connect`), else None: then
# every wait is a plain sleep, as before.
_current: Wakeups | None = None


def remove_stale() -> int:
    """Remove the socket directories of processes that ended without closing them (killed,
    or torn down by MPI_Abort): a socket file that no process holds refuses a datagram (a live
    one just gets a spurious wake-up). The number removed."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    probe.setblocking(False)
    removed = 0
    for directory in glob.glob(os.path.join(tempfile.gettempdir(), "pipeinfer-wake-*")):
        try:
            probe.sendto(b"", os.path.join(directory, Channel.MAIN.name.lower()))
        except ConnectionRefusedError:
            shutil.rmtree(directory, ignore_errors=True)
            removed += 1
        except OSError:
            pass  # being set up, another user's, full: not ours to judge
    probe.close()
    return removed


def connect(link) -> frozenset[int]:
    """Collective over `link`'s ranks (an mpi_transport.Link), once at start-up: this
    process's wake-ups, greeted by the ranks of its host; from then on every send wakes its
    destination and every wait listens. Returns the ranks that can wake this one."""
    try:
        remove_stale()
        wakeups = Wakeups(link.rank)
    except OSError:  # no Unix sockets here: this rank polls as before
        wakeups = None
    table = link.allgather(None if wakeups is None else wakeups.address())
    if wakeups is not None:
        wakeups.greet(table)
    link.barrier()  # every greeting sent
    if wakeups is None:
        return frozenset()
    heard = wakeups.heard()
    install(wakeups)
    atexit.register(wakeups.close)
    return heard


def current() -> Wakeups | None:
    return _current


def install(wakeups: Wakeups | None) -> None:
    """Make `wakeups` the process's (None: back to plain sleeps); the old one is closed."""
    global _current
    old, _current = _current, wakeups
    if old is not None and old is not wakeups:
        old.close()


def notify(rank: int, channel: Channel) -> None:
    """Wake `rank` on `channel` through the process's wake-ups, if any."""
    wakeups = _current
    if wakeups is not None:
        wakeups.notify(rank, channel)


def wake_self(channel: Channel) -> None:
    """Wake this process's waiter on `channel` (from another thread), if wake-ups are on."""
    wakeups = _current
    if wakeups is not None:
        wakeups.wake_self(channel)


def sleep(seconds: float, channel: Channel = Channel.MAIN) -> bool:
    """Sleep `seconds`, or less if a wake-up comes on `channel`; True if woken."""
    wakeups = _current
    if wakeups is None:
        if seconds > 0:
            time.sleep(seconds)
        return False
    return wakeups.wait(seconds, channel)
