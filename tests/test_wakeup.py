"""Waiting without spinning and waking when a message comes (engine/transport/wakeup.py, issue 34).

In-process: the sockets, greetings and wake-ups themselves. Under real mpiexec: an idle
worker costs next to no CPU, and a worker idle for a while picks a message up at once.
"""

from __future__ import annotations

import os
import statistics
import textwrap
import time
from pathlib import Path

import pytest

from support.mpi_util import MPIEXEC, PYTHON, launch, mpmd_command
from pipeinfer.engine.transport import wakeup, wakeup_net
from pipeinfer.engine.transport.backoff import (MAX_SLEEP_S, WOKEN_MAX_SLEEP_S, WOKEN_QUIET_S,
                                                IdleBackoff, idle_backoff)
from pipeinfer.engine.transport.wakeup import Channel, Wakeups


@pytest.fixture
def pair():
    a, b = Wakeups(0), Wakeups(1)
    table = [a.address(), b.address()]
    a.greet(table)
    b.greet(table)
    yield a, b
    a.close()
    b.close()


def test_greetings_say_who_can_wake_whom(pair) -> None:
    a, b = pair
    assert a.heard() == {1} and b.heard() == {0}
    assert a.can_wake(1) and b.can_wake(0) and not a.can_wake(0)


def test_a_rank_on_another_host_is_not_greeted() -> None:
    a = Wakeups(0)
    try:
        a.greet([a.address(), ("elsewhere/boot", ("/nonexistent/main", "/nonexistent/c")),
                 None])
        assert not a.can_wake(1) and not a.can_wake(2) and a.heard() == frozenset()
    finally:
        a.close()


def test_notify_wakes_only_its_channel(pair) -> None:
    a, b = pair
    a.heard(), b.heard()
    a.notify(1, Channel.CANCEL)
    assert not b.wait(0.01, Channel.MAIN)
    t0 = time.monotonic()
    assert b.wait(5.0, Channel.CANCEL)
    assert time.monotonic() - t0 < 0.5
    assert not b.wait(0.001, Channel.CANCEL)  # consumed


def test_wait_times_out_and_wake_self(pair) -> None:
    a, _ = pair
    a.heard()
    t0 = time.monotonic()
    assert not a.wait(0.02)
    assert time.monotonic() - t0 >= 0.015
    a.wake_self(Channel.MAIN)
    assert a.wait(5.0)


def test_closed_wakeups_remove_their_files() -> None:
    a = Wakeups(3)
    assert os.path.exists(a.paths[0])
    a.close()
    a.close()
    assert not os.path.exists(a.dir)
    a.notify(0)  # harmless


def test_directories_left_by_killed_processes_are_removed(pair) -> None:
    a, _ = pair
    dead = Wakeups(5)
    for sock in dead._socks:   # as if killed: the files stay, nobody holds the sockets
        sock.close()
    assert wakeup.remove_stale() >= 1
    assert not os.path.exists(dead.dir) and os.path.exists(a.paths[0])


def test_a_woken_backoff_starts_again_from_short_sleeps(pair) -> None:
    a, b = pair
    a.heard(), b.heard()
    backoff = IdleBackoff(first=1e-3, limit=0.5, max_limit=0.5,
                          sleep=lambda s: b.wait(s, Channel.MAIN))
    backoff.delay = 0.4
    a.notify(1)
    t0 = time.monotonic()
    assert backoff.wait()
    assert time.monotonic() - t0 < 0.2 and backoff.delay == 0.0


def test_a_woken_wait_takes_quick_looks_only_after_a_wake_up() -> None:
    """Where every message wakes the waiter, activity is followed by sleeps of WOKEN_QUIET_S
    or more (nothing announced is on its way); a wake-up by a look at once, then quick looks
    from 20 us (what it announced may need a few to arrive). Without wake-ups every wait
    starts with quick looks."""
    slept, wake = [], [False]

    def sleep(seconds: float) -> bool:
        slept.append(seconds)
        return wake[0]

    backoff = idle_backoff(True, sleep=sleep)
    backoff.reset()                                          # activity
    for _ in range(3):
        backoff.wait()
    assert len(slept) == 3 and min(slept) >= WOKEN_QUIET_S
    slept.clear()
    wake[0] = True
    backoff.wait()                                           # a sleep a wake-up ends
    wake[0] = False
    for _ in range(4):
        backoff.wait()                                       # a look, then quick looks
    assert len(slept) == 4 and slept[1] == pytest.approx(20e-6)
    assert slept[1:4] == sorted(slept[1:4]) and slept[3] < WOKEN_QUIET_S
    polling = IdleBackoff(sleep=sleep)
    polling.reset()
    slept.clear()
    polling.wait(), polling.wait()
    assert slept == [pytest.approx(20e-6)]


# --- ranks of different hosts: the network path (engine/transport/wakeup_net.py) ---------------------

def _connect_in_process(*wakeups: Wakeups, wait: float = 0.2) -> list[frozenset[int]]:
    """wakeup.connect's steps for ranks of one process: greet, heard, routes, adopt."""
    table = [w.address() for w in wakeups]
    for w in wakeups:
        w.greet(table)
    heard = [w.heard(wait) for w in wakeups]
    all_routes = [w.routes() for w in wakeups]
    for w in wakeups:
        w.adopt(all_routes)
    return heard


@pytest.fixture
def hosts(monkeypatch):
    """Wakeups of rank i on a machine of its own (PIPEINFER_HOST_ID), any environment given."""
    made = []

    def make(rank: int, **env: str) -> Wakeups:
        monkeypatch.setenv(wakeup.HOST_VAR, f"test-host-{rank}")
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        made.append(Wakeups(rank))
        for key in env:
            monkeypatch.delenv(key)
        return made[-1]
    yield make
    for w in made:
        w.close()


def test_ranks_of_different_hosts_wake_each_other_over_the_network(hosts) -> None:
    a, b = hosts(0), hosts(1)
    assert a.address()[0] != b.address()[0]
    assert _connect_in_process(a, b) == [{1}, {0}]
    routes = a.routes()
    assert routes[1].isdigit(), "a rank of another host must come by its network address"
    assert a.can_wake(1) and b.can_wake(0)
    b.notify(0, Channel.CANCEL)
    assert not a.wait(0.01, Channel.MAIN)
    t0 = time.monotonic()
    assert a.wait(5.0, Channel.CANCEL)
    assert time.monotonic() - t0 < 0.5
    a.notify(1)
    assert b.wait(5.0, Channel.MAIN) and not b.wait(0.001, Channel.MAIN)


def test_the_unix_socket_is_preferred_on_one_host(pair) -> None:
    a, b = pair
    a._greetings.clear(), b._greetings.clear()
    assert _connect_in_process(a, b) == [{1}, {0}]
    assert a.routes() == {1: "u"} and b.routes() == {0: "u"}


def test_an_unreachable_rank_is_not_woken_and_does_not_wait_for_wakeups(hosts) -> None:
    """Rank 1's only address does not reach it (a firewall, a wrong interface): its greetings
    still reach rank 0, but rank 0's do not reach it, so it polls for rank 0's messages and
    rank 0 sends it no wake-ups."""
    a, b = hosts(0), hosts(1, **{wakeup_net.ADDR_VAR: "203.0.113.1"})  # TEST-NET-3
    t0 = time.monotonic()
    assert _connect_in_process(a, b, wait=0.2) == [{1}, frozenset()]
    assert time.monotonic() - t0 < 2.0
    assert not a.can_wake(1) and b.can_wake(0)
    assert 0 not in b.wakes_from and 1 in a.wakes_from  # worker.woken_by: b polls for 0


def test_a_greeting_of_another_job_does_not_count(hosts) -> None:
    a, b = hosts(0), hosts(1)
    table = [a.address(), b.address()]
    a.greet(table)
    stranger = wakeup_net.greeting(1, 0, "not-b-nonce", "0")
    for port in a.net.ports:
        b.net.out.sendto(stranger, ("127.0.0.1", port))
    assert a.heard(0.1) == frozenset()  # b never greeted; the stranger's nonce is not b's


def test_no_network_wakeups_when_asked(hosts) -> None:
    a = hosts(0, **{wakeup_net.ADDR_VAR: "none"})
    assert a.net is None and a.address()[2] is None


def test_sleep_without_wakeups_is_a_plain_sleep() -> None:
    assert wakeup.current() is None
    t0 = time.monotonic()
    assert not wakeup.sleep(0.01)
    assert time.monotonic() - t0 >= 0.009


# --- under mpiexec ---------------------------------------------------------------------------

IDLE_SECONDS = 5.0
IDLE_CPU_MAX = 0.02
# With wake-ups a worker idle for long sleeps in steps of up to WOKEN_MAX_SLEEP_S (100 ms): a
# pick-up that waited for the sleep to end would take 50 ms on average. One that a wake-up
# ends takes about a millisecond; the bounds leave room for a machine shared with other jobs.
PICKUP_MEDIAN_MAX_S = WOKEN_MAX_SLEEP_S / 10
PICKUP_MAX_S = WOKEN_MAX_SLEEP_S / 4

WAKE_JOB = textwrap.dedent('''
    """Rank 0 is a head, rank 1 a worker without a stage (so the last one). `idle`: rank 0
    samples the worker's CPU time from /proc over SECONDS; `pickup`: rank 0 leaves the worker
    idle for a while, sends it a busy probe and sleeps until the answer wakes it, repeatedly."""
    import json, os, sys, time
    from pipeinfer.engine.transport import wakeup, wakeup_net
    from pipeinfer.engine.transport.backoff import IdleBackoff
    from pipeinfer.engine.transport.head_transport import HeadTransport
    from pipeinfer.engine.transport.mpi import Link
    from pipeinfer.engine.transport.worker_link import WorkerLink
    from pipeinfer.engine.worker.loop import Worker

    MODE, SECONDS, WAKE = sys.argv[1], float(sys.argv[2]), sys.argv[3] == "wake"
    TICK = os.sysconf("SC_CLK_TCK")

    def cpu_s(pid):
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK   # utime + stime

    link = Link()
    pids = link.gather(os.getpid())
    heard = wakeup.connect(link) if WAKE else frozenset()
    heard_all = link.gather(sorted(heard))
    if link.rank == 0:
        head, out = HeadTransport(1), {"heard": sorted(heard), "heard_all": heard_all}
        time.sleep(0.5)                                # the worker enters its loop
        if MODE == "idle":
            c0, t0 = cpu_s(pids[1]), time.monotonic()
            time.sleep(SECONDS)
            out["cpu"] = (cpu_s(pids[1]) - c0) / (time.monotonic() - t0)
        else:
            out["pickup"] = []
            for idle in (0.05, 0.2, 0.5, 1.0, 0.1, 0.7, 1.5, 0.3, 1.0, 2.0):
                time.sleep(idle)
                t0 = time.monotonic()
                head.send_busy_probe()
                backoff = IdleBackoff()                # as the head's driver waits
                while head.poll_busy() is None:
                    backoff.wait()
                out["pickup"].append(time.monotonic() - t0)
        out["stats"] = head.shutdown()
        print(json.dumps(out), flush=True)
    else:
        Worker(WorkerLink(), None).run()
''')


def _wake_job(tmp_path: Path, mode: str, seconds: float, wake: str = "wake",
              envs: tuple[dict, dict] | None = None) -> dict:
    """Run WAKE_JOB on 2 ranks; `envs`: each rank's own environment variables (e.g. another
    PIPEINFER_HOST_ID per rank: ranks of different machines)."""
    script = tmp_path / "wake_job.py"
    script.write_text(WAKE_JOB)
    args = [str(PYTHON), str(script), mode, str(seconds), wake]
    if envs is None:
        cmd = [MPIEXEC, "-n", "2", *args]
    else:
        cmd = mpmd_command([(1, ["env", *(f"{k}={v}" for k, v in env.items()), *args])
                            for env in envs])
    res = launch(cmd, timeout=90)
    assert res.rc == 0 and res.json is not None, res.describe()
    assert [s["rank"] for s in res.json["stats"]] == [1]
    return res.json


@pytest.mark.slow
def test_an_idle_worker_uses_next_to_no_cpu(tmp_path: Path) -> None:
    out = _wake_job(tmp_path, "idle", IDLE_SECONDS)
    assert out["heard"] == [1]
    assert out["cpu"] < IDLE_CPU_MAX, f"the idle worker used {out['cpu']:.1%} of a core"


def _pickups(tmp_path: Path, envs: tuple[dict, dict] | None = None) -> tuple[dict, list]:
    """WAKE_JOB's pickup mode and its round trips, sorted. A shared VM has spells in which
    every wake-up is slow for minutes (seventh session: 5-15 ms round trips in a full CI run,
    1-2 ms alone right after), so a job outside the bounds is measured once more before the
    verdict; a worker that is not woken waits out its sleep (~50 ms) in both."""
    for _ in range(2):
        out = _wake_job(tmp_path, "pickup", 0, envs=envs)
        pickup = sorted(out["pickup"])
        if statistics.median(pickup) < PICKUP_MEDIAN_MAX_S and pickup[-2] < PICKUP_MAX_S:
            break
    return out, pickup


@pytest.mark.slow
def test_an_idle_worker_picks_a_message_up_at_once(tmp_path: Path) -> None:
    """Round trips head -> worker -> head after idle gaps of 50 ms to 2 s: two pick-ups (the
    worker's, then the head's) and the worker's answer, well within the worker's sleep."""
    _, pickup = _pickups(tmp_path)
    assert statistics.median(pickup) < PICKUP_MEDIAN_MAX_S, pickup
    # a machine shared with other jobs may delay one of them
    assert pickup[-2] < PICKUP_MAX_S, f"round trips {[f'{p * 1e3:.2f} ms' for p in pickup]}"


@pytest.mark.slow
def test_ranks_of_different_hosts_pick_messages_up_at_once(tmp_path: Path) -> None:
    """As test_an_idle_worker_picks_a_message_up_at_once, but each rank on a machine of its
    own (PIPEINFER_HOST_ID, as cluster.py's nodes): the wake-ups go over UDP."""
    envs = ({wakeup.HOST_VAR: "host-a"}, {wakeup.HOST_VAR: "host-b"})
    out, pickup = _pickups(tmp_path, envs)
    assert out["heard_all"] == [[1], [0]]
    assert statistics.median(pickup) < PICKUP_MEDIAN_MAX_S, pickup
    assert pickup[-2] < PICKUP_MAX_S, f"round trips {[f'{p * 1e3:.2f} ms' for p in pickup]}"


@pytest.mark.slow
def test_an_idle_worker_of_another_host_uses_next_to_no_cpu(tmp_path: Path) -> None:
    envs = ({wakeup.HOST_VAR: "host-a"}, {wakeup.HOST_VAR: "host-b"})
    out = _wake_job(tmp_path, "idle", IDLE_SECONDS, envs=envs)
    assert out["heard_all"] == [[1], [0]]
    assert out["cpu"] < IDLE_CPU_MAX, f"the idle worker used {out['cpu']:.1%} of a core"


@pytest.mark.slow
def test_a_worker_that_cannot_be_reached_polls(tmp_path: Path) -> None:
    """The worker's advertised address does not reach it: it is not woken by the head and
    falls back to polling (5 ms ceiling), and the job still answers every probe."""
    envs = ({wakeup.HOST_VAR: "host-a"},
            {wakeup.HOST_VAR: "host-b", wakeup_net.ADDR_VAR: "203.0.113.1"})
    out = _wake_job(tmp_path, "pickup", 0, envs=envs)
    assert out["heard_all"] == [[1], []]
    pickup = sorted(out["pickup"])
    assert len(pickup) == 10 and pickup[-2] < 10 * MAX_SLEEP_S, pickup


# A sender whose large message waits for a receiver busy for a second calls into MPI to move
# it: at a fixed 250 us that cost it ~10 % of a core; its pace now grows while it waits. Once
# the receiver asks, it wakes the sender until the message is in: 1.5 MB took 5-12 ms here
# (17-23 ms without the wake-ups, 8-20 ms with two busy loops beside it); the bound is for a
# transfer left to the sender's long pace, or stuck.
SENDER_CPU_MAX = 0.03
RECEIVE_MAX_S = 0.04

SEND_JOB = textwrap.dedent('''
    """Rank 0 sends rank 1 a 1.5 MB array (past MPICH's eager limit: it moves only while rank 0
    calls into MPI) and waits for rank 1's answer as an idle rank does; rank 1 is busy for
    BUSY seconds before it receives it, then answers at once. Rank 0 reports its CPU share
    while waiting, rank 1 how long the receive took."""
    import json, sys, time
    import numpy as np
    from pipeinfer.engine.transport import wakeup
    from pipeinfer.engine.transport.backoff import idle_backoff
    from pipeinfer.engine.transport.mpi import Link
    from pipeinfer.engine.transport.wire import Tag

    BUSY, ROUNDS = float(sys.argv[1]), int(sys.argv[2])
    link = Link()
    heard = wakeup.connect(link)
    out = {"heard": sorted(heard), "cpu": [], "recv_s": []}
    for _ in range(ROUNDS):
        if link.rank == 0:
            c0, t0 = time.process_time(), time.monotonic()
            link.send(1, (np.ones(384 * 1024, dtype=np.float32), Tag.ACTIVATIONS))
            backoff = idle_backoff(True, sleep=link.sleep)
            while link.recv_array(1, Tag.BUSY, np.float64, wait=False) is None:
                backoff.wait()
            out["cpu"].append((time.process_time() - c0) / (time.monotonic() - t0))
        else:
            time.sleep(BUSY)
            t0 = time.monotonic()
            got = link.recv_array(0, Tag.ACTIVATIONS, np.float32)
            out["recv_s"].append(time.monotonic() - t0)
            assert got.size == 384 * 1024 and float(got.sum()) == got.size
            link.send(0, (np.zeros(1), Tag.BUSY))
    out["all"] = link.gather(out)
    if link.rank == 0:
        print(json.dumps({"ranks": out["all"]}), flush=True)
    link.flush()
''')


@pytest.mark.slow
def test_a_large_send_to_a_busy_rank_costs_its_sender_next_to_no_cpu(tmp_path: Path) -> None:
    """The sender's calls into MPI slow down while its message waits, and the receiver, when
    it asks, wakes the sender and gets the message within milliseconds."""
    script = tmp_path / "send_job.py"
    script.write_text(SEND_JOB)
    res = launch([MPIEXEC, "-n", "2", str(PYTHON), str(script), "1.0", "3"], timeout=90)
    assert res.rc == 0 and res.json is not None, res.describe()
    sender, receiver = res.json["ranks"]
    assert sender["heard"] == [1] and receiver["heard"] == [0]
    assert statistics.median(sender["cpu"]) < SENDER_CPU_MAX, sender["cpu"]
    assert statistics.median(receiver["recv_s"]) < RECEIVE_MAX_S, receiver["recv_s"]


PROBE_JOB = textwrap.dedent('''
    """Rank 1 sends rank 0 a small message ROUNDS times, each once rank 0 sleeps; rank 0
    sleeps until the send's wake-up and then probes once: does one look find it?"""
    import json, sys, time
    import numpy as np
    from pipeinfer.engine.transport import wakeup
    from pipeinfer.engine.transport.mpi import Link
    from pipeinfer.engine.transport.wire import Tag

    ROUNDS = int(sys.argv[1])
    link = Link()
    heard = wakeup.connect(link)
    found = []
    for i in range(ROUNDS):
        link.barrier()
        if link.rank == 1:
            time.sleep(0.02)                          # rank 0 is asleep by now
            link.send(0, (np.array([i], dtype=np.int64), Tag.RESULT))
        else:
            while not wakeup.sleep(1.0):              # until the send wakes this rank
                pass
            found.append(link.probe(1, Tag.RESULT) is not None)
            assert int(link.recv_array(1, Tag.RESULT, np.int64)[0]) == i
    link.flush()
    if link.rank == 0:
        print(json.dumps({"heard": sorted(heard), "found": found}), flush=True)
''')


def test_the_first_probe_after_a_wake_up_finds_the_message(tmp_path: Path) -> None:
    """A message is in by the time its wake-up is: one probe finds it, so the turn a wake-up
    brings is the one that takes the message (MPICH's Iprobe alone answers 'nothing' after
    the progress that took the message in: every message would cost its receiver a turn)."""
    script = tmp_path / "probe_job.py"
    script.write_text(PROBE_JOB)
    res = launch([MPIEXEC, "-n", "2", str(PYTHON), str(script), "20"], timeout=90)
    assert res.rc == 0 and res.json is not None, res.describe()
    assert res.json["heard"] == [1]
    assert res.json["found"] == [True] * 20, res.json["found"]
