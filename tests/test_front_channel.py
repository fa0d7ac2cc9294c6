"""The channel between the front and the job's head (front/channel.py, serve/link.py) over TCP,
as when the head runs on another host: the job's end connects with the key from its
environment and messages go both ways; a peer without the key is refused and delivers
nothing. Which way a head reaches the front follows the hosts (reach_of)."""

from __future__ import annotations

import socket
import threading
import time
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client

import pytest

from pipeinfer.front.channel import Channel, reach_of
from pipeinfer.serve import link


class Inbox:
    def __init__(self):
        self.messages: list[tuple[int, tuple | None]] = []
        self.arrived = threading.Condition()

    def deliver(self, job: int, message: tuple | None) -> None:
        with self.arrived:
            self.messages.append((job, message))
            self.arrived.notify_all()

    def wait_for(self, count: int) -> list:
        with self.arrived:
            assert self.arrived.wait_for(lambda: len(self.messages) >= count, timeout=10)
            return list(self.messages)


@pytest.fixture
def tcp_channel():
    inbox = Inbox()
    channel = Channel(inbox.deliver, reach="127.0.0.1")
    yield channel, inbox
    channel.close()


def test_a_head_with_the_key_talks_over_tcp(tcp_channel, monkeypatch):
    channel, inbox = tcp_channel
    assert channel.tcp and channel.address.startswith("127.0.0.1:")
    channel.expect(3)
    for name, value in channel.env(3).items():
        monkeypatch.setenv(name, value)
    conn = link.connect(channel.address)     # what the job's head does
    try:
        conn.send(("hello", 1234, 3, "node1"))
        conn.send(("beat",))
        assert inbox.wait_for(2) == [(3, ("hello", 1234, 3, "node1")), (3, ("beat",))]
        assert channel.send(3, ("stop",))
        assert conn.poll(10) and conn.recv() == ("stop",)
    finally:
        conn.close()
    assert inbox.wait_for(3)[2] == (3, None)   # its connection closed


def test_a_peer_without_the_key_is_refused_and_delivers_nothing(tcp_channel, monkeypatch):
    channel, inbox = tcp_channel
    channel.expect(1)
    host, port = channel.address.rsplit(":", 1)
    with pytest.raises(AuthenticationError):
        Client((host, int(port)), family="AF_INET", authkey=b"x" * 32)
    raw = socket.create_connection((host, int(port)), timeout=10)   # no handshake at all
    raw.sendall(b"\x00\x00\x00\x05hello")
    raw.close()
    for name, value in channel.env(1).items():   # the listener still takes the real head
        monkeypatch.setenv(name, value)
    conn = link.connect(channel.address)
    conn.send(("hello", 1, 1, "h"))
    assert inbox.wait_for(1) == [(1, ("hello", 1, 1, "h"))]
    conn.close()


def test_a_replaced_job_cannot_connect(tcp_channel, monkeypatch):
    channel, inbox = tcp_channel
    channel.expect(2)
    for name, value in channel.env(1).items():
        monkeypatch.setenv(name, value)
    conn = link.connect(channel.address)
    conn.send(("hello", 1, 1, "h"))         # job 1 was replaced by job 2: closed on it
    assert conn.poll(10)
    with pytest.raises(EOFError):
        conn.recv()
    assert inbox.messages == []


def test_the_channel_is_a_unix_socket_only_when_every_host_is_this_one():
    this = socket.gethostname()
    assert reach_of(None, None) is None
    assert reach_of(["localhost", this, f"{this}"], None) is None
    assert reach_of(["node0", this], None) not in (None, "localhost")
    assert reach_of(["localhost"], "10.1.2.3") == "10.1.2.3"   # as given, whatever the hosts
    inbox = Inbox()
    unix = Channel(inbox.deliver)
    try:
        assert not unix.tcp and unix.address.startswith("/")
    finally:
        unix.close()


def test_a_head_keeps_trying_until_the_front_listens_then_gives_up(monkeypatch):
    from multiprocessing.connection import Listener
    key = b"k" * 32
    monkeypatch.setenv(link.KEY_ENV, key.hex())
    spare = socket.socket()
    spare.bind(("127.0.0.1", 0))
    port = spare.getsockname()[1]
    spare.close()                       # nothing listens there yet: refused at first
    got: list = []

    def front_later():
        time.sleep(2.0)
        with Listener(("127.0.0.1", port), "AF_INET", authkey=key) as listener:
            while True:   # the head's reachability probe comes first, without the key
                try:
                    conn = listener.accept()
                    break
                except (AuthenticationError, EOFError, OSError):
                    continue
            got.append(conn.recv())
            conn.close()

    thread = threading.Thread(target=front_later, daemon=True)
    thread.start()
    conn = link.connect(f"127.0.0.1:{port}", wait_s=30)
    conn.send(("hello",))
    thread.join(10)
    conn.close()
    assert got == [("hello",)]
    with pytest.raises(ConnectionRefusedError):   # no front at all: it gives up, saying why
        link.connect(f"127.0.0.1:{port}", wait_s=1.5)
