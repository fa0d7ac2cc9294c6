"""Waking a waiting rank when a message is sent to it, without spinning.

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
other hosts. For those, each process also has one UDP socket per channel (wakeup_net.py),
and a rank whose Unix socket it cannot reach is poked there. Which ranks can wake which, and
how, is checked at start-up (`connect`: `greet`, `heard`, `routes`, `adopt`): every rank greets
every other on both channels by every route it has (the Unix socket on its own host, each of
the receiver's network addresses), the receiver reports the best route that arrived on both
channels (the Unix socket, else the first address) and the sender uses only that one. A pair
whose greetings did not arrive has no wake-ups; waits on such a pair only probe. Wake-ups
never carry data: a lost or spurious one changes when a rank looks, not what it finds.
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

from . import wakeup_net

BOOT_ID = "/proc/sys/kernel/random/boot_id"
DRAIN_MAX = 256  # datagrams read per wake-up at most (more means a busy sender: look anyway)
# How long a rank waits at start-up for the greetings of ranks that may reach it over the
# network (sent before a barrier all ranks passed: on a LAN they are there within a ms); a
# rank that cannot be reached costs the others this once.
GREETING_WAIT_S = 0.5


class Channel(enum.IntEnum):
    MAIN = 0
    CANCEL = 1


# Names the machine a rank stands for where that is not its kernel: experiments/cluster.py
# sets it per emulated node, so that ranks of different "machines" do not wake each other
# through this kernel's sockets, as ranks on real machines cannot.
HOST_VAR = "PIPEINFER_HOST_ID"


def _entry(entry) -> tuple:
    """(host key, paths, network address or None, nonce) of an address-table entry."""
    host, paths, net, nonce = (tuple(entry) + (None, None))[:4]
    return host, paths, net, nonce


def _route_rank(route: str) -> int:
    """Order of preference: the Unix socket, then the receiver's addresses in its order."""
    return -1 if route == wakeup_net.UNIX_ROUTE else int(route)


def host_key() -> str:
    """Names this kernel: ranks with equal keys can reach each other's socket files."""
    try:
        with open(BOOT_ID) as f:
            boot = f.read().strip()
    except OSError:
        boot = "?"
    return f"{socket.gethostname()}/{boot}/{os.environ.get(HOST_VAR, '')}"


class Wakeups:
    """This process's wake-up sockets and the routes to the peers it can wake."""

    def __init__(self, rank: int):
        self.rank = rank
        self.host, self.nonce = host_key(), wakeup_net.new_nonce()
        self.dir = tempfile.mkdtemp(prefix=f"pipeinfer-wake-r{rank}-")
        self.paths = tuple(os.path.join(self.dir, ch.name.lower()) for ch in Channel)
        self._socks: list[socket.socket] = []
        self.net: wakeup_net.NetSockets | None = None
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
        try:
            self.net = wakeup_net.NetSockets(len(Channel))
        except OSError:  # no IPv4 here: only the ranks of this host wake this one
            pass
        self._table: list = []
        self._greetings: dict[int, dict[str, set[int]]] = {}  # sender -> route -> channels
        self._peers: dict[int, tuple[socket.socket, tuple]] = {}  # rank -> (socket, dests)
        self.wakes_from: frozenset[int] = frozenset()  # ranks whose greetings arrived

    def address(self) -> tuple:
        """What the other ranks need to wake this one (exchanged at start-up): (host key,
        Unix socket paths, network address or None, nonce)."""
        return self.host, self.paths, self.net and self.net.address(), self.nonce

    # --- start-up --------------------------------------------------------------------------
    def greet(self, table: list) -> None:
        """Given every rank's address (rank order), greet each other rank on every channel,
        through its Unix sockets if it is on this host and at each of its network addresses.
        Until `adopt` says which route arrived, a rank is woken by the first that may."""
        self._table = table
        for rank, entry in enumerate(table):
            if entry is None or rank == self.rank:
                continue
            host, paths, net, _ = _entry(entry)
            if host == self.host and self._greet_unix(rank, paths):
                self._peers[rank] = (self._out, tuple(paths))
            if net and self.net is not None and self.net.greet(net, self.rank, rank,
                                                               self.nonce):
                dests = wakeup_net.route_to(net, "0")
                if rank not in self._peers and dests:
                    self._peers[rank] = (self.net.out, dests)

    def _greet_unix(self, rank: int, paths) -> bool:
        data = wakeup_net.greeting(self.rank, rank, self.nonce, wakeup_net.UNIX_ROUTE)
        try:
            for path in paths:
                self._out.sendto(data, path)
        except OSError:
            return False  # not reachable from here (another mount namespace, ...)
        return True

    def heard(self, wait: float = GREETING_WAIT_S) -> frozenset[int]:
        """After every rank greeted (a barrier): the ranks heard on every channel, i.e. the
        ranks that can wake this one. Waits up to `wait` s for greetings still on the
        network from the ranks that may reach this one. Clears the sockets."""
        expected = {rank for rank, entry in enumerate(self._table)
                    if rank != self.rank and self._may_reach_me(entry)}
        deadline = time.monotonic() + wait
        while True:
            for channel in Channel:
                for sock in self._waited(channel):
                    for greeting in self._drain(sock):
                        self._note(greeting, channel)
            self.wakes_from = frozenset(self.routes())
            left = deadline - time.monotonic()
            if expected <= self.wakes_from or left <= 0:
                return self.wakes_from
            try:
                select.select(self._socks + (self.net.socks if self.net else []), [], [], left)
            except (OSError, ValueError):
                return self.wakes_from

    def _may_reach_me(self, entry) -> bool:
        if entry is None:
            return False
        host, _, net, _ = _entry(entry)
        return host == self.host or (net is not None and self.net is not None)

    def _note(self, greeting: tuple[int, int, str, str], channel: Channel) -> None:
        sender, receiver, nonce, route = greeting
        if receiver != self.rank or not 0 <= sender < len(self._table) or sender == self.rank:
            return
        entry = self._table[sender]
        if route != wakeup_net.UNIX_ROUTE and not route.isdigit():
            return
        if entry is None or _entry(entry)[3] != nonce:
            return  # not from this job's rank `sender`
        self._greetings.setdefault(sender, {}).setdefault(route, set()).add(channel)

    def routes(self) -> dict[int, str]:
        """For each rank heard on every channel, the best route it came by: the Unix socket,
        else the lowest index of this rank's network addresses."""
        best = {}
        for sender, by_route in self._greetings.items():
            full = [route for route, channels in by_route.items() if len(channels) == len(Channel)]
            if full:
                best[sender] = min(full, key=_route_rank)
        return best

    def adopt(self, all_routes: list) -> None:
        """Given every rank's `routes()` (rank order, None for a rank without wake-ups): wake
        each rank by the route its greeting from this one arrived on, and no other."""
        for rank, routes in enumerate(all_routes):
            if rank == self.rank:
                continue
            route = (routes or {}).get(self.rank)
            peer = None if route is None else self._route(rank, route)
            if peer is None:
                self._peers.pop(rank, None)
            else:
                self._peers[rank] = peer

    def _route(self, rank: int, route: str) -> tuple[socket.socket, tuple] | None:
        _, paths, net, _ = _entry(self._table[rank])
        if route == wakeup_net.UNIX_ROUTE:
            return self._out, tuple(paths)
        dests = wakeup_net.route_to(net, route) if net and self.net else None
        return (self.net.out, dests) if dests else None

    # --- use -------------------------------------------------------------------------------
    def can_wake(self, rank: int) -> bool:
        return rank in self._peers

    def notify(self, rank: int, channel: Channel = Channel.MAIN) -> None:
        """Wake `rank` if it waits on `channel` (nothing if it cannot be woken from here)."""
        peer = self._peers.get(rank)
        if peer is None:
            return
        sock, dests = peer
        try:
            sock.sendto(b"", dests[channel])
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

    def _waited(self, channel: Channel) -> list[socket.socket]:
        """The sockets a wake-up on `channel` may come to (Unix, then UDP if any)."""
        if not self._socks:
            return []
        socks = [self._socks[channel]]
        if self.net is not None and self.net.socks:
            socks.append(self.net.socks[channel])
        return socks

    def wait(self, timeout: float, channel: Channel = Channel.MAIN) -> bool:
        """Sleep until a wake-up on `channel` or `timeout` seconds; True if woken (the
        channel's pending wake-ups are consumed)."""
        socks = self._waited(channel)
        if not socks:  # closed (shutdown)
            time.sleep(max(0.0, timeout))
            return False
        try:
            ready, _, _ = select.select(socks, [], [], max(0.0, timeout))
        except (OSError, ValueError):  # closed meanwhile (shutdown): sleep all the same
            time.sleep(max(0.0, timeout))
            return False
        if not ready:
            return False
        for sock in ready:
            for _ in self._drain(sock):
                pass
        return True

    def _drain(self, sock: socket.socket) -> Iterable[tuple[int, int, str, str]]:
        """Read the waiting datagrams; yields the greetings among them (parsed)."""
        for _ in range(DRAIN_MAX):
            try:
                data = sock.recv(128)
            except (BlockingIOError, OSError):
                return
            if data:
                greeting = wakeup_net.parse_greeting(data)
                if greeting is not None:
                    yield greeting

    def close(self) -> None:
        """Close the sockets and remove their files. Safe to call twice."""
        for sock in self._socks + [getattr(self, "_out", None)]:
            if sock is not None:
                sock.close()
        self._socks = []
        if getattr(self, "net", None) is not None:
            self.net.close()
        shutil.rmtree(self.dir, ignore_errors=True)


# The process's wake-ups once connected (`connect`), else None: then every wait is a plain
# sleep between probes.
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
    process's wake-ups, greeted by the other ranks (two exchanges: the addresses, then which
    greetings arrived, so that each sender keeps the route that reaches its receiver); from
    then on every send wakes its destination and every wait listens. Returns the ranks that
    can wake this one."""
    try:
        remove_stale()
        wakeups = Wakeups(link.rank)
    except OSError:  # no Unix sockets here: this rank only polls
        wakeups = None
    table = link.allgather(None if wakeups is None else wakeups.address())
    if wakeups is not None:
        wakeups.greet(table)
    link.barrier()  # every greeting sent
    heard = frozenset() if wakeups is None else wakeups.heard()
    all_routes = link.allgather(None if wakeups is None else wakeups.routes())
    if wakeups is None:
        return heard
    wakeups.adopt(all_routes)
    install(wakeups)
    atexit.register(wakeups.close)
    return heard


def current() -> Wakeups | None:
    return _current


def woken_by(ranks) -> bool:
    """Whether every one of `ranks` wakes this process when it sends to it."""
    return _current is not None and set(ranks) <= _current.wakes_from


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
