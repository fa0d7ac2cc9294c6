"""A userspace link emulator for kernels without the netem qdisc (used by cluster.py).

Every emulated node gets a TAP device named eth0 inside its own network namespace; the fds of
all TAP devices stay with one forwarding thread (LinkHub) that acts as an Ethernet switch:

    node A's stack -> A's eth0 (a TAP device) -> LinkHub reads the frame
        -> A's egress link: waits for the link (serialisation at the rate, drop-tail queue),
           then the one-way delay +- jitter
        -> written to the TAP of the destination (its learnt MAC; broadcasts and unknown
           destinations are flooded to all other nodes) -> node B's stack

so, as with netem on each node's egress, one hop costs one delay and a ping between two nodes
takes 2 x delay. Jitter is uniform in [delay - jitter, delay + jitter] (netem's default
distribution), but a link never reorders its frames (a frame waits for the one before it, as
netem does when a rate is set). With the frames' offloads on (IFF_VNET_HDR + TUNSETOFFLOAD),
TCP hands the hub segments of up to 64 KiB, so one Python read/write moves many MTU-sized
packets; the hub accounts a segmented frame at its on-wire size (headers repeated per MTU
segment, like the kernel's qdisc_pkt_len).

TAP devices are not persistent: they vanish when the hub's fds are closed, i.e. when the
process holding them exits, whatever the reason.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import heapq
import math
import os
import random
import re
import select
import stat
import struct
import threading
import time
from dataclasses import dataclass, field

TUN_PATH = "/dev/net/tun"
TUNSETIFF = 0x400454CA
TUNSETOFFLOAD = 0x400454D0
IFF_TAP, IFF_NO_PI, IFF_VNET_HDR = 0x0002, 0x1000, 0x4000
TUN_F_CSUM, TUN_F_TSO4, TUN_F_TSO6, TUN_F_TSO_ECN = 0x01, 0x02, 0x04, 0x08
VNET_HDR = struct.Struct("<BBHHHH")  # flags, gso_type, hdr_len, gso_size, csum_start, csum_off
VNET_GSO_TCPV4, VNET_GSO_TCPV6, VNET_GSO_ECN = 1, 4, 0x80
CLONE_NEWNET = 0x40000000
PR_SET_TIMERSLACK = 29
READ_SIZE = 65536 + 512  # a 64 KiB GSO frame with its headers and the vnet header
READS_PER_WAKEUP = 64  # frames read from one TAP before looking at the others again


class LinkHubError(RuntimeError):
    pass


# --- units (tc syntax) -----------------------------------------------------------------------
_RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
               "kibit": 1024, "mibit": 1024 ** 2, "gibit": 1024 ** 3, "tibit": 1024 ** 4,
               "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9, "tbps": 8e12,
               "kibps": 8 * 1024, "mibps": 8 * 1024 ** 2, "gibps": 8 * 1024 ** 3,
               "tibps": 8 * 1024 ** 4}
_TIME_UNITS = {"s": 1.0, "sec": 1.0, "secs": 1.0, "ms": 1e-3, "msec": 1e-3, "msecs": 1e-3,
               "us": 1e-6, "usec": 1e-6, "usecs": 1e-6}


def parse_rate(text: str) -> float:
    """A tc rate ("1gbit", "100mbit", "12.5mbps" = bytes/s, a bare number = bit/s) in bit/s."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-z]*)\s*", text.lower())
    if not match or match.group(2) not in _RATE_UNITS | {"": 1}:
        raise ValueError(f"bad rate {text!r} (tc syntax: 1gbit, 100mbit, 500kbit, 12mbps)")
    value = float(match.group(1)) * _RATE_UNITS.get(match.group(2), 1)
    if value <= 0:
        raise ValueError(f"rate {text!r} must be positive")
    return value


def parse_time(text: str) -> float:
    """A tc time ("0.2ms", "1s", "150us", a bare number = microseconds) in seconds."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-z]*)\s*", text.lower())
    if not match or match.group(2) not in _TIME_UNITS | {"": 1e-6}:
        raise ValueError(f"bad time {text!r} (tc syntax: 0.2ms, 5ms, 150us, 1s)")
    return float(match.group(1)) * _TIME_UNITS.get(match.group(2), 1e-6)


# --- TAP devices -----------------------------------------------------------------------------
def ensure_tun_device() -> bool:
    """Make sure /dev/net/tun exists; returns True if this call created the node (the caller
    removes it afterwards). Raises LinkHubError if it is missing and cannot be created."""
    try:
        if stat.S_ISCHR(os.stat(TUN_PATH).st_mode):
            return False
        raise LinkHubError(f"{TUN_PATH} exists but is not a character device")
    except FileNotFoundError:
        pass
    try:
        os.makedirs(os.path.dirname(TUN_PATH), exist_ok=True)
        os.mknod(TUN_PATH, 0o600 | stat.S_IFCHR, os.makedev(10, 200))
    except OSError as err:
        raise LinkHubError(f"{TUN_PATH} is missing and cannot be created: {err}") from None
    return True


def _setns(path: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns {path}: {os.strerror(err)}")
    finally:
        os.close(fd)


def _open_tap(name: str) -> int:
    fd = os.open(TUN_PATH, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        ifreq = struct.pack("16sH22x", name.encode(), IFF_TAP | IFF_NO_PI | IFF_VNET_HDR)
        fcntl.ioctl(fd, TUNSETIFF, ifreq)
        # The kernel may hand us checksum-less TCP segments of up to 64 KiB (it would otherwise
        # segment and checksum every 1500-byte packet for a Python loop to move one by one).
        fcntl.ioctl(fd, TUNSETOFFLOAD, TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6 | TUN_F_TSO_ECN)
    except OSError:
        os.close(fd)
        raise
    return fd


def open_taps(netns_paths: list[str], name: str = "eth0") -> list[int]:
    """Create a TAP device NAME inside each network namespace (/run/netns/...) and return the
    fds (non-blocking, close-on-exec). The devices are born inside the namespaces (a helper
    thread enters each with setns before opening /dev/net/tun), never in the caller's, and
    live as long as their fds."""
    fds: list[int] = []
    failure: list[BaseException] = []

    def work() -> None:  # setns changes only this thread's namespace
        try:
            for path in netns_paths:
                _setns(path)
                fds.append(_open_tap(name))
        except BaseException as err:  # noqa: BLE001 - re-raised in the caller
            failure.append(err)

    thread = threading.Thread(target=work, name="linkhub-taps")
    thread.start()
    thread.join()
    if failure:
        for fd in fds:
            os.close(fd)
        err = failure[0]
        raise LinkHubError(f"cannot create a TAP device: {err}") from None
    return fds


def wire_bytes(data: bytes) -> int:
    """On-wire bytes of a frame read with its vnet header: a TCP segment the kernel left
    unsegmented (GSO) counts its headers once per MTU-sized packet."""
    _, gso_type, _, gso_size, csum_start, _ = VNET_HDR.unpack_from(data)
    size = len(data) - VNET_HDR.size
    if gso_type & ~VNET_GSO_ECN in (VNET_GSO_TCPV4, VNET_GSO_TCPV6) and gso_size:
        offset = VNET_HDR.size + csum_start + 12  # TCP data offset field
        if offset < len(data):
            headers = csum_start + (data[offset] >> 4) * 4
            segments = max(1, math.ceil((size - headers) / gso_size))
            return size + (segments - 1) * headers
    return size


# --- the forwarder ---------------------------------------------------------------------------
@dataclass
class Link:
    """One node's egress: delay and jitter in seconds; rate in bit/s (None: unlimited); a
    frame that would wait behind more than `limit` bytes is dropped (drop-tail, like netem's
    1000-packet limit)."""
    delay: float
    jitter: float = 0.0
    rate: float | None = None
    limit: int = 1 << 20
    free_at: float = 0.0  # when the link has serialised everything queued so far
    last_arrival: float = 0.0  # when the last frame reaches the far end (no reordering)
    frames: int = 0
    bytes: int = 0
    drops: int = 0


@dataclass(order=True)
class _Delivery:
    due: float
    seq: int
    data: bytes = field(compare=False)
    ports: tuple[int, ...] = field(compare=False)


class LinkHub:
    """An Ethernet switch between TAP fds, one Link (egress shaping) per port, run on a
    daemon thread. start() / stop(); stop() also closes the fds, which removes the devices."""

    def __init__(self, fds: list[int], links: list[Link], seed: int | None = None):
        if len(fds) != len(links):
            raise ValueError("one link per TAP fd")
        self.fds, self.links = fds, links
        self.rng = random.Random(seed)
        self.macs: dict[bytes, int] = {}
        self.queue: list[_Delivery] = []
        self.seq = 0
        self.errors: list[str] = []
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="linkhub", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def cpu_time(self) -> float | None:
        """CPU seconds the forwarding thread has used so far (None once it has ended)."""
        try:
            return time.clock_gettime(time.pthread_getcpuclockid(self._thread.ident))
        except (OSError, TypeError, AttributeError):
            return None

    def stop(self) -> None:
        self._stopping = True
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        for fd in self.fds + [self._wake_r, self._wake_w]:
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds = []

    # The loop: select() takes its timeout in microseconds (epoll only in milliseconds, too
    # coarse for a 0.2 ms delay), and a handful of fds is select()'s best case.
    def _run(self) -> None:
        try:
            ctypes.CDLL(None).prctl(PR_SET_TIMERSLACK, 1000, 0, 0, 0)  # wake within ~1 us
        except (OSError, AttributeError):
            pass
        ports = {fd: port for port, fd in enumerate(self.fds)}
        watch = list(self.fds) + [self._wake_r]
        queue, monotonic = self.queue, time.monotonic
        try:
            while not self._stopping:
                timeout = None
                if queue:
                    timeout = max(0.0, queue[0].due - monotonic())
                readable, _, _ = select.select(watch, [], [], timeout)
                for fd in readable:
                    if fd == self._wake_r:
                        continue
                    self._receive(fd, ports[fd])
                now = monotonic()
                while queue and queue[0].due <= now:
                    self._deliver(heapq.heappop(queue))
        except Exception as err:  # noqa: BLE001 - reported by the owner
            if not self._stopping:
                self.errors.append(f"{type(err).__name__}: {err}")

    def _receive(self, fd: int, port: int) -> None:
        link, now = self.links[port], time.monotonic()
        for _ in range(READS_PER_WAKEUP):
            try:
                data = os.read(fd, READ_SIZE)
            except BlockingIOError:
                return
            except OSError as err:
                if err.errno in (errno.EBADFD, errno.EIO, errno.EBADF):  # device gone
                    return
                raise
            if len(data) < VNET_HDR.size + 14:
                continue
            frame = VNET_HDR.size
            src, dst = data[frame + 6:frame + 12], data[frame:frame + 6]
            if not src[0] & 1:
                self.macs[src] = port
            target = self.macs.get(dst) if not dst[0] & 1 else None
            if target == port:
                continue  # for the sender itself: a real switch would drop it too
            ports = (target,) if target is not None else \
                tuple(p for p in range(len(self.fds)) if p != port)
            size = wire_bytes(data)
            start = max(now, link.free_at)
            if link.rate is not None:
                if (start - now) * link.rate / 8 > link.limit:
                    link.drops += 1  # drop-tail: the queue holds `limit` bytes' worth of time
                    continue
                link.free_at = start + size * 8 / link.rate
                start = link.free_at
            delay = link.delay
            if link.jitter:
                delay = max(0.0, delay + self.rng.uniform(-link.jitter, link.jitter))
            due = max(start + delay, link.last_arrival)
            link.last_arrival = due
            link.frames += 1
            link.bytes += size
            self.seq += 1
            if due <= now:
                self._deliver(_Delivery(due, self.seq, data, ports))
            else:
                heapq.heappush(self.queue, _Delivery(due, self.seq, data, ports))

    def _deliver(self, item: _Delivery) -> None:
        for port in item.ports:
            try:
                os.write(self.fds[port], item.data)
            except OSError:  # the receiver's device is down or gone: the frame is lost
                pass
