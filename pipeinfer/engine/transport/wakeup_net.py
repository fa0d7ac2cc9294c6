"""Wake-ups between hosts: one UDP socket per channel, beside the Unix sockets.

wakeup.py's Unix datagram sockets reach only the processes of one kernel. Ranks on
other machines (or emulated as such by experiments/cluster.py) would wait for each other's
messages by polling, up to the back-off's 5 ms ceiling per hop. So every rank also binds one
UDP socket per channel on all of its host's IPv4 addresses and tells the others which
addresses it has (`local_addresses`) and which ports its sockets got; a rank sending to a rank
of another host then pokes it with an empty UDP datagram, as it does through the Unix socket
on its own host.

Which of a rank's addresses reaches it from where is not known in advance (a host has a
loopback, maybe several networks, a firewall): the start-up greeting goes to every address,
the receiver reports which one arrived (wakeup.connect's second exchange) and the sender keeps
that one. A rank whose greetings did not arrive is not woken over the network: it polls, as
before. Wake-ups carry no data, so a lost datagram (UDP may drop one) costs latency only.

Greetings name the job: each rank draws a random nonce that the address exchange spreads, and
a greeting counts only with its sender's nonce and its receiver's rank, so a stray datagram
(another job, a port reused) never makes a rank believe it can be woken.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import socket
import struct

# Where a rank can be reached over the network, if not all of its host's addresses (comma-
# separated IPv4 addresses, e.g. the one MPI's traffic uses); "none": no network wake-ups.
ADDR_VAR = "PIPEINFER_WAKE_ADDR"
MAX_ADDRESSES = 8  # greetings go to every address: a host with dozens gets only the first
SIOCGIFFLAGS, SIOCGIFADDR, IFF_UP = 0x8913, 0x8915, 0x1
UNIX_ROUTE = "u"  # a greeting that came through the Unix socket (not an address index)


def new_nonce() -> str:
    return secrets.token_hex(8)


def local_addresses() -> list[str]:
    """This host's IPv4 addresses to be reached at: $PIPEINFER_WAKE_ADDR if set, else every
    up interface's, the loopback last (it reaches only this host, so it is a fallback)."""
    override = os.environ.get(ADDR_VAR)
    if override is not None:
        if override.strip().lower() == "none":
            return []
        return [a.strip() for a in override.split(",") if a.strip()][:MAX_ADDRESSES]
    found: list[str] = []
    try:
        probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    except OSError:
        return []
    with probe:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            try:
                flags, = struct.unpack("H", fcntl.ioctl(probe, SIOCGIFFLAGS, request)[16:18])
                if flags & IFF_UP:
                    found.append(socket.inet_ntoa(
                        fcntl.ioctl(probe, SIOCGIFADDR, request)[20:24]))
            except OSError:
                continue  # no IPv4 address on it
    found = list(dict.fromkeys(found))
    found.sort(key=lambda address: address.startswith("127."))
    return found[:MAX_ADDRESSES]


def greeting(sender: int, receiver: int, nonce: str, route: str) -> bytes:
    """A greeting's bytes: who sends it to whom, the sender's nonce and the route taken
    (UNIX_ROUTE or the index of the receiver's address it was sent to)."""
    return f"{sender} {receiver} {nonce} {route}".encode()


def parse_greeting(data: bytes) -> tuple[int, int, str, str] | None:
    """(sender, receiver, nonce, route) of a greeting, None if `data` is not one."""
    try:
        sender, receiver, nonce, route = data.decode().split()
        return int(sender), int(receiver), nonce, route
    except ValueError:  # UnicodeDecodeError is one
        return None


class NetSockets:
    """A rank's UDP sockets, one per channel, bound to every local address on a port of the
    kernel's choice, and a socket to send from. Raises OSError if the host has no IPv4."""

    def __init__(self, channels: int):
        self.addresses = local_addresses()
        self.socks: list[socket.socket] = []
        try:
            if not self.addresses:
                raise OSError("no address to be reached at")
            for _ in range(channels):
                sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                self.socks.append(sock)
                sock.bind(("0.0.0.0", 0))
                sock.setblocking(False)
            self.out = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            self.out.setblocking(False)
        except OSError:
            self.close()
            raise
        self.ports = tuple(sock.getsockname()[1] for sock in self.socks)

    def address(self) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """What the other ranks need to reach these sockets: (addresses, ports by channel)."""
        return tuple(self.addresses), self.ports

    def greet(self, peer: tuple, sender: int, receiver: int, nonce: str) -> bool:
        """Send `peer` ((addresses, ports)) a greeting on every channel at every address; True
        if any left this host (arrival is the receiver's to tell)."""
        addresses, ports = peer
        sent = False
        for index, host in enumerate(addresses[:MAX_ADDRESSES]):
            data = greeting(sender, receiver, nonce, str(index))
            for port in ports:
                try:
                    self.out.sendto(data, (host, port))
                    sent = True
                except OSError:
                    pass  # no route to that address, a full buffer: try the next
        return sent

    def close(self) -> None:
        for sock in self.socks + [getattr(self, "out", None)]:
            if sock is not None:
                sock.close()
        self.socks = []


def route_to(peer: tuple, route: str) -> tuple[tuple[str, int], ...] | None:
    """The per-channel (host, port) destinations of `peer` ((addresses, ports)) by the route
    its greeting arrived on (an address index); None if that is not an address of it."""
    addresses, ports = peer
    try:
        host = addresses[int(route)]
    except (ValueError, IndexError):
        return None
    return tuple((host, port) for port in ports)
