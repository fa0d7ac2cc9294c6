"""The emulated cluster harness (experiments/cluster.py) really does what it promises: per-rank
CPU quotas that bind, shaped links that MPI traffic actually crosses, and nothing left behind.

Needs root, a cgroup cpu controller and network namespaces; skipped (with the reason) where the
machine forbids them."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import statistics
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from experiments.harness import linkhub
from experiments.harness.cpu_quota import CGROUP_V1, CGROUP_V2
from support.cluster import CLUSTER, NO_NETNS, needs_cgroups, needs_netns
from support.mpi_util import PIPEINFER, PYTHON, launch, run_pipeinfer

ROOT = Path(__file__).resolve().parents[1]


def netns_list() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def cluster(*args, timeout: float = 120, env: dict | None = None):
    """Run cluster.py -v ARGS; return the launch and the job id it used."""
    result = launch([PYTHON, CLUSTER, "-v", *args], timeout=timeout, env=env)
    match = re.search(r"--cgroup \S*/pipeinfer-([0-9a-f]+)", result.stderr)
    assert match, f"no job id in cluster.py -v output\n{result.describe()}"
    return result, match.group(1)


def assert_cleaned_up(job: str) -> None:
    """No cgroup, namespace or process of the job is left."""
    for root in (CGROUP_V1, CGROUP_V2):
        assert not (root / f"pipeinfer-{job}").exists(), f"cgroup pipeinfer-{job} left behind"
    left = [ns for ns in netns_list() if ns.startswith(f"pi{job}")]
    assert not left, f"network namespaces left behind: {left}"
    stray = subprocess.run(["pgrep", "-f", f"pipeinfer-{job}"], capture_output=True, text=True)
    assert stray.stdout.strip() == "", f"processes of job {job} still running: {stray.stdout}"


def write_script(tmp_path: Path, name: str, code: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(code))
    return path


# A rank that spins for SECONDS and reports its CPU time, wall time and the quota of its cgroup.
BUSY = """
    import json, os, sys, time
    seconds = float(sys.argv[1])
    wall0, cpu0 = time.perf_counter(), time.process_time()
    while time.perf_counter() - wall0 < seconds:
        pass
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    quota = period = None
    for line in open("/proc/self/cgroup"):
        _, controllers, path = line.rstrip("\\n").split(":", 2)
        if "cpu" in controllers.split(","):  # cgroup v1
            base = "/sys/fs/cgroup/cpu" + path
            quota = int(open(base + "/cpu.cfs_quota_us").read())
            period = int(open(base + "/cpu.cfs_period_us").read())
        elif controllers == "" and quota is None and os.path.exists("/sys/fs/cgroup" + path
                                                                      + "/cpu.max"):
            q, p = open("/sys/fs/cgroup" + path + "/cpu.max").read().split()
            quota, period = (None if q == "max" else int(q)), int(p)
    # one write per line: ranks print at the same time through one launcher pipe
    sys.stdout.write(json.dumps({"rank": int(os.environ.get("PMI_RANK", -1)), "cpu": cpu,
                                 "wall": wall, "quota": quota, "period": period}) + "\\n")
    sys.stdout.flush()
"""


def rank_reports(stdout: str) -> dict[int, dict]:
    reports = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    return {r["rank"]: r for r in reports}


def unconstrained_share(tmp_path: Path, seconds: float = 1.5) -> float:
    """CPU share two unconstrained busy processes get right now (1.0 on an idle 2-core box)."""
    script = write_script(tmp_path, "busy_free.py", BUSY)
    procs = [subprocess.Popen([PYTHON, script, str(seconds)], stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    shares = [json.loads(p.communicate()[0])["cpu"] / seconds for p in procs]
    return min(shares)


@needs_cgroups
def test_cpu_quota_binds(tmp_path):
    """Two ranks under --cpu 0.25 each get 0.25 cores (CPU time / wall time within 20%)."""
    script = write_script(tmp_path, "busy.py", BUSY)
    target, seconds = 0.25, 2.0
    attempts = []
    for _ in range(3):
        result, job = cluster("--nodes", "2", "--cpu", str(target), "--",
                              PYTHON, script, str(seconds))
        assert result.rc == 0, result.describe()
        assert_cleaned_up(job)
        reports = rank_reports(result.stdout)
        assert sorted(reports) == [0, 1], result.describe()
        for report in reports.values():  # the rank really sits in a cgroup with the quota
            assert report["quota"] is not None, report
            assert report["quota"] / report["period"] == pytest.approx(target)
        ratios = [r["cpu"] / r["wall"] for r in reports.values()]
        attempts.append(ratios)
        # a quota is a ceiling whatever else runs on the machine
        assert all(ratio <= target * 1.2 for ratio in ratios), f"quota exceeded: {attempts}"
        if all(ratio >= target * 0.8 for ratio in ratios):
            return
    # Below the quota every time: only acceptable when other jobs leave too little CPU.
    share = unconstrained_share(tmp_path)
    if share < 2 * target * 1.5:
        pytest.skip(f"machine too busy to check the quota's lower bound (unconstrained "
                    f"processes got {share:.2f} cores; ranks got {attempts}); the ceiling and "
                    "the cgroup quotas were verified")
    pytest.fail(f"ranks got less than {target * 0.8:.2f} cores under --cpu {target}: "
                f"{attempts} (unconstrained processes get {share:.2f})")


BURSTS = """
    import json, sys, time
    walls = []
    for _ in range(int(sys.argv[1])):
        time.sleep(0.1)                       # idle, as a stage between two runs
        t0, wall0 = time.thread_time(), time.perf_counter()
        while time.thread_time() - t0 < 0.015:
            pass
        walls.append(time.perf_counter() - wall0)
    print(json.dumps({"median_wall": sorted(walls)[len(walls) // 2]}))
"""


@needs_cgroups
def test_a_node_idle_before_a_burst_runs_it_at_its_quota(tmp_path):
    """A half-core node that waited computes 15 ms of CPU in no less than about 30 ms: under
    the default period (fitted to the quota) a burst gets no more than the quota. (Under a
    10 ms period the kernel let such bursts take about 20 ms, as if the node were faster
    whenever it had waited.)"""
    script = write_script(tmp_path, "bursts.py", BURSTS)
    result, job = cluster("--nodes", "1", "--cpu", "0.5", "--", PYTHON, script, "9")
    assert result.rc == 0, result.describe()
    assert_cleaned_up(job)
    report = json.loads(next(line for line in result.stdout.splitlines()
                             if line.startswith("{")))
    assert report["median_wall"] >= 0.025, report


@needs_cgroups
def test_heterogeneous_quotas_per_rank(tmp_path):
    script = write_script(tmp_path, "busy.py", BUSY)
    result, job = cluster("--nodes", "3", "--cpus", "0.25,0.5,1.5", "--", PYTHON, script, "0")
    assert result.rc == 0, result.describe()
    reports = rank_reports(result.stdout)
    assert {rank: r["quota"] / r["period"] for rank, r in reports.items()} == \
        {0: pytest.approx(0.25), 1: pytest.approx(0.5), 2: pytest.approx(1.5)}
    assert_cleaned_up(job)


@needs_netns
@pytest.mark.parametrize("command, rc", [
    (["{python}", "-c", "import sys; sys.exit(3)"], 3),
    (["/nonexistent/command"], None),
])
def test_cleanup_when_the_command_fails(command, rc):
    command = [c.format(python=PYTHON) for c in command]
    result, job = cluster("--nodes", "2", "--cpu", "0.5", "--link", "gigabit", "--", *command)
    if rc is None:
        assert result.rc != 0, result.describe()
    else:
        assert result.rc == rc, result.describe()
    assert_cleaned_up(job)


@needs_netns
def test_cleanup_after_timeout():
    marker = "31.4159"  # a sleep nobody else runs: find stray ranks by it
    t0 = time.perf_counter()
    result, job = cluster("--nodes", "2", "--cpu", "0.5", "--link", "slow", "--timeout", "2",
                          "--", "sleep", marker, timeout=60)
    assert time.perf_counter() - t0 < 30
    assert result.rc == 2 and "exceeded --timeout" in result.stderr, result.describe()
    assert_cleaned_up(job)
    stray = subprocess.run(["pgrep", "-f", f"sleep {marker}"], capture_output=True, text=True)
    assert stray.stdout.strip() == "", "ranks survived the timeout"


# A rank that reads its network namespace's eth0 counters around an MPI ping-pong.
PINGPONG = """
    import json, os, sys, time
    import numpy as np
    from mpi4py import MPI

    def eth0():
        for line in open("/proc/self/net/dev"):  # the counters of this process's netns
            name, _, data = line.partition(":")
            if name.strip() == "eth0":
                fields = data.split()
                return int(fields[0]), int(fields[8])  # rx bytes, tx bytes
        return None

    size, rounds = int(sys.argv[1]), int(sys.argv[2])
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    buf = np.zeros(size, dtype=np.uint8)
    before = eth0()  # before the barrier: rank 0 starts sending as soon as it leaves it
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(rounds):
        if rank == 0:
            comm.Send(buf, dest=1)
            comm.Recv(buf, source=1)
        else:
            comm.Recv(buf, source=0)
            comm.Send(buf, dest=0)
    elapsed = time.perf_counter() - t0
    after = eth0()
    # one write per line: both ranks print at the same time through one launcher pipe
    sys.stdout.write(json.dumps({"rank": rank, "before": before, "after": after,
                                 "elapsed": elapsed,
                                 "netns": os.readlink("/proc/self/ns/net")}) + "\\n")
    sys.stdout.flush()
"""


@needs_netns
def test_mpi_traffic_crosses_the_shaped_veths(tmp_path):
    """Each rank sits in its own namespace; the payload shows up in its eth0 byte counters
    (not shared memory or loopback), at the slow preset's 100 Mbit/s."""
    script = write_script(tmp_path, "pingpong.py", PINGPONG)
    size, rounds = 1 << 20, 4
    result, job = cluster("--nodes", "2", "--cpu", "1", "--link", "slow", "--",
                          PYTHON, script, str(size), str(rounds))
    assert result.rc == 0, result.describe()
    assert_cleaned_up(job)
    reports = rank_reports(result.stdout)
    assert sorted(reports) == [0, 1], result.describe()
    assert reports[0]["netns"] != reports[1]["netns"]
    payload = size * rounds
    for report in reports.values():
        assert report["before"] is not None, f"rank {report['rank']} has no eth0"
        rx = report["after"][0] - report["before"][0]
        tx = report["after"][1] - report["before"][1]
        assert rx >= payload and tx >= payload, \
            f"rank {report['rank']}: eth0 rx {rx} / tx {tx} bytes for a {payload}-byte payload"
        assert rx < 3 * payload and tx < 3 * payload
    # 2 x 4 MiB one after the other through 100 Mbit/s links: at least 0.67 s
    elapsed = max(r["elapsed"] for r in reports.values())
    assert elapsed >= 0.9 * 2 * payload * 8 / 100e6, f"link not rate-limited: {elapsed:.3f} s"


# Wraps `pipeinfer run` in a rank: eth0 counters before and after, written to a file.
COUNTING_WRAPPER = """
    import json, os, subprocess, sys

    def eth0():
        for line in open("/proc/self/net/dev"):
            name, _, data = line.partition(":")
            if name.strip() == "eth0":
                fields = data.split()
                return int(fields[0]), int(fields[8])
        return None

    out = sys.argv[1]
    before = eth0()
    rc = subprocess.run(sys.argv[2:], close_fds=False).returncode  # keep the PMI socket
    after = eth0()
    with open(f"{out}.{os.environ['PMI_RANK']}", "w") as handle:
        json.dump({"before": before, "after": after, "rc": rc}, handle)
    sys.exit(rc)
"""


@needs_netns
def test_pipeinfer_runs_over_slow_links(tmp_path, tiny_model, tiny_draft_aligned):
    """Two ranks run `pipeinfer run` with --link slow: same tokens as under plain mpiexec, and
    the activations travel over each rank's eth0."""
    wrapper = write_script(tmp_path, "wrapper.py", COUNTING_WRAPPER)
    counts = tmp_path / "counts"
    args = ["-m", tiny_model, "-md", tiny_draft_aligned, "-p", "Hello world", "-n", "16",
            "--ignore-eos", "--strategy", "pipeinfer", "--json"]
    result, job = cluster("--nodes", "2", "--cpu", "1", "--link", "slow", "--",
                          PYTHON, wrapper, counts, PIPEINFER, "run", *args, timeout=180)
    assert result.rc == 0, result.describe()
    assert_cleaned_up(job)
    assert result.json is not None and result.json["n_generated"] == 16, result.describe()
    reference = run_pipeinfer(2, tiny_model, "Hello world", "-md", tiny_draft_aligned,
                              "--ignore-eos", "--strategy", "pipeinfer", n_predict=16)
    assert reference.rc == 0, reference.describe()
    assert result.json["tokens"] == reference.json["tokens"]
    for rank in (0, 1):
        report = json.loads(Path(f"{counts}.{rank}").read_text())
        assert report["rc"] == 0
        rx = report["after"][0] - report["before"][0]
        tx = report["after"][1] - report["before"][1]
        # 16+ activation rows of 64 floats (and logits back) cross the link
        assert rx > 4096 and tx > 4096, f"rank {rank}: eth0 rx {rx} tx {tx} bytes"


def _netem_missing() -> str | None:
    """Why netem cannot be used here (tested in a throwaway namespace), or None."""
    if NO_NETNS:
        return NO_NETNS
    name = f"ptnetem{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], capture_output=True, check=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], capture_output=True)
        result = subprocess.run(["tc", "-n", name, "qdisc", "add", "dev", "lo", "root", "netem",
                                 "delay", "1ms"], capture_output=True, text=True)
        if result.returncode != 0:
            return f"this kernel has no netem qdisc (tc: {result.stderr.strip()})"
        return None
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def _tap_missing() -> str | None:
    """Why cluster.py's userspace links (TAP devices) cannot be used here, or None."""
    if NO_NETNS:
        return NO_NETNS
    if not os.path.exists(linkhub.TUN_PATH):
        return f"{linkhub.TUN_PATH} is missing"
    name = f"pttap{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], capture_output=True, check=True)
    try:
        for fd in linkhub.open_taps([f"/run/netns/{name}"]):
            os.close(fd)
        return None
    except linkhub.LinkHubError as err:
        return str(err)
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


SHAPER_MISSING = {"netem": _netem_missing, "tap": _tap_missing}


@pytest.fixture(params=["netem", "tap"])
def shaper(request) -> str:
    """Each way cluster.py can emulate a delay: kernel netem, and the userspace forwarder
    (linkhub.py, the fallback on kernels without netem); each skipped where impossible."""
    reason = SHAPER_MISSING[request.param]()
    if reason:
        pytest.skip(reason)
    return request.param


# Rank 0 times small MPI round trips one by one, then one BULK-byte message (and a 1-byte ack).
LINKPROBE = """
    import json, sys, time
    import numpy as np
    from mpi4py import MPI

    rounds, bulk = int(sys.argv[1]), int(sys.argv[2])
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    small = np.zeros(8, dtype=np.uint8)

    def roundtrip(message, reply):
        t0 = time.perf_counter()
        if rank == 0:
            comm.Send(message, dest=1)
            comm.Recv(reply, source=1)
        else:
            comm.Recv(message, source=0)
            comm.Send(reply, dest=0)
        return (time.perf_counter() - t0) * 1000

    for _ in range(3):  # connections and ARP entries are set up
        roundtrip(small, small)
    comm.Barrier()
    rtts = [roundtrip(small, small) for _ in range(rounds)]
    bulk_ms = None
    if bulk:
        big = np.zeros(bulk, dtype=np.uint8)
        comm.Barrier()
        bulk_ms = roundtrip(big, small)
    if rank == 0:
        sys.stdout.write(json.dumps({"rtts": rtts, "bulk_ms": bulk_ms}) + "\\n")
        sys.stdout.flush()
"""


def link_probe(tmp_path: Path, shaper: str, *link: str, rounds: int = 30, bulk: int = 0):
    """Run LINKPROBE on two ranks over `--link custom LINK` with the given shaper; returns
    rank 0's report (round trips in ms, the bulk message's time in ms)."""
    script = write_script(tmp_path, "linkprobe.py", LINKPROBE)
    result, job = cluster("--nodes", "2", "--cpu", "1", "--link", "custom", *link,
                          "--shaper", shaper, "--", PYTHON, script, str(rounds), str(bulk))
    assert result.rc == 0, result.describe()
    assert_cleaned_up(job)
    assert f"links shaped by {shaper}" in result.stderr, result.describe()
    assert result.json is not None, result.describe()
    return result.json


def test_link_adds_its_delay(tmp_path, shaper):
    """A 5 ms link (each way) makes an MPI round trip between two ranks take ~10 ms: at least
    2 x delay, at most 50% more, and clearly above the same link without delay."""
    delay_ms = 5
    base = link_probe(tmp_path, shaper, "--rate", "1gbit", "--delay", "0ms")
    shaped = link_probe(tmp_path, shaper, "--rate", "1gbit", "--delay", f"{delay_ms}ms")
    base_ms, rtt_ms = statistics.median(base["rtts"]), statistics.median(shaped["rtts"])
    assert 0.9 * 2 * delay_ms <= rtt_ms <= 1.5 * 2 * delay_ms, \
        f"median round trip {rtt_ms:.2f} ms over a {delay_ms} ms link (unshaped {base_ms:.2f})"
    assert rtt_ms - base_ms >= 0.8 * 2 * delay_ms, (rtt_ms, base_ms)
    # no round trip beats the delay: it is a floor, not an average
    assert min(shaped["rtts"]) >= 0.95 * 2 * delay_ms, sorted(shaped["rtts"])[:5]


def test_link_rate_limits_a_bulk_message(tmp_path, shaper):
    """1 MiB over a 10 Mbit/s link takes ~0.88 s (payload plus TCP/IP headers) +-30%."""
    size, rate = 1 << 20, 10e6
    report = link_probe(tmp_path, shaper, "--rate", "10mbit", "--delay", "1ms", rounds=3,
                        bulk=size)
    expected_ms = size * 8 / rate * (1 + 66 / 1448) * 1000  # Ethernet+IP+TCP headers per MSS
    assert 0.7 * expected_ms <= report["bulk_ms"] <= 1.3 * expected_ms, \
        f"1 MiB took {report['bulk_ms']:.0f} ms at 10 Mbit/s (expected ~{expected_ms:.0f})"


def test_link_jitter_varies_round_trips(tmp_path, shaper):
    """5 ms +- 2 ms each way: round trips spread over milliseconds around 10 ms."""
    report = link_probe(tmp_path, shaper, "--rate", "1gbit", "--delay", "5ms",
                        "--jitter", "2ms", rounds=40)
    rtts = sorted(report["rtts"])
    deciles = statistics.quantiles(rtts, n=10)
    assert 7 <= statistics.median(rtts) <= 16, rtts
    assert deciles[-1] - deciles[0] >= 1.5, f"round trips barely vary: {rtts}"
    assert min(rtts) >= 0.95 * 2 * (5 - 2), rtts


@needs_netns
@pytest.mark.parametrize("signum, rc", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_cleanup_on_signal(signum, rc):
    """Ctrl-C or a SIGTERM to cluster.py mid-job: the ranks, namespaces, links (and the link
    forwarder with its TAP devices) and cgroups are gone afterwards."""
    marker = "27.1828" if signum == signal.SIGINT else "27.1829"
    proc = subprocess.Popen([PYTHON, CLUSTER, "-v", "--nodes", "2", "--cpu", "0.5", "--link",
                             "slow", "--", "sleep", marker], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        job, lines = None, []
        while job is None:
            line = proc.stderr.readline()
            assert line, "cluster.py ended early:\n" + "".join(lines)
            lines.append(line)
            match = re.search(r"--cgroup \S*/pipeinfer-([0-9a-f]+)", line)
            job = match and match.group(1)
        deadline = time.monotonic() + 30
        while subprocess.run(["pgrep", "-f", f"sleep {marker}"],
                             capture_output=True).returncode != 0:
            assert time.monotonic() < deadline, "the ranks never started"
            time.sleep(0.1)
        assert any(ns.startswith(f"pi{job}") for ns in netns_list())
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == rc, "".join(lines) + err
    assert_cleaned_up(job)
    stray = subprocess.run(["pgrep", "-f", f"sleep {marker}"], capture_output=True, text=True)
    assert stray.stdout.strip() == "", "ranks survived the signal"


# --- the userspace link emulator itself (no root needed: socket pairs stand in for TAPs) ---
def vnet_frame(dst: bytes, src: bytes, size: int, tag: int = 0) -> bytes:
    """A frame as read from a TAP with IFF_VNET_HDR: 10-byte vnet header (no offloads) +
    Ethernet header + payload whose first 4 bytes are TAG; SIZE counts from the Ethernet
    header on."""
    payload = tag.to_bytes(4, "big") + bytes(size - 14 - 4)
    return bytes(10) + dst + src + b"\x08\x00" + payload


MAC = [bytes([2, 0, 0, 0, 0, i]) for i in range(4)]
BROADCAST = b"\xff" * 6


class HubPorts:
    """A LinkHub over socket pairs: `ends[i]` is what node i's TAP would be."""

    def __init__(self, links: list):
        pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET) for _ in links]
        for hub_end, _ in pairs:
            hub_end.setblocking(False)
        self.ends = [end for _, end in pairs]
        self.hub = linkhub.LinkHub([hub_end.detach() for hub_end, _ in pairs], links, seed=1)
        self.hub.start()

    def recv(self, port: int, timeout: float = 2.0) -> tuple[bytes, float] | None:
        self.ends[port].settimeout(timeout)
        try:
            return self.ends[port].recv(1 << 17), time.monotonic()
        except socket.timeout:
            return None

    def close(self):
        self.hub.stop()
        for end in self.ends:
            end.close()


def test_linkhub_delays_floods_and_learns():
    ports = HubPorts([linkhub.Link(delay=0.03) for _ in range(3)])
    try:
        t0 = time.monotonic()
        ports.ends[0].send(vnet_frame(BROADCAST, MAC[0], 100, tag=1))
        for port in (1, 2):  # flooded to everyone else, one delay later
            frame, at = ports.recv(port)
            assert frame[10 + 14:10 + 18] == (1).to_bytes(4, "big")
            assert 0.03 <= at - t0 < 0.5
        assert ports.recv(0, timeout=0.1) is None, "a frame went back to its sender"
        ports.ends[1].send(vnet_frame(MAC[0], MAC[1], 100, tag=2))  # MAC[0] was learnt
        frame, _ = ports.recv(0)
        assert frame[10 + 14:10 + 18] == (2).to_bytes(4, "big")
        assert ports.recv(2, timeout=0.1) is None, "a unicast frame was flooded"
    finally:
        ports.close()


def test_linkhub_rate_keeps_order_under_jitter():
    """20 frames of 1000 bytes at 1 Mbit/s leave 8 ms apart; jitter of +-4 ms on a 5 ms delay
    never reorders them."""
    ports = HubPorts([linkhub.Link(delay=0.005, jitter=0.004, rate=1e6) for _ in range(2)])
    try:
        t0 = time.monotonic()
        for tag in range(20):
            ports.ends[0].send(vnet_frame(MAC[1], MAC[0], 1000, tag=tag))
        arrivals = [ports.recv(1) for _ in range(20)]
        assert all(arrivals), "frames lost"
        tags = [int.from_bytes(frame[24:28], "big") for frame, _ in arrivals]
        assert tags == list(range(20)), f"reordered: {tags}"
        last = arrivals[-1][1] - t0
        assert last >= 20 * 1000 * 8 / 1e6 + 0.001, f"rate not enforced: {last:.3f} s"
        assert last < 0.16 + 0.009 + 0.5
        assert ports.hub.links[0].frames == 20 and ports.hub.links[0].bytes == 20 * 1000
    finally:
        ports.close()


def test_linkhub_counts_segmented_frames_on_the_wire():
    """A 64 KiB TCP segment the kernel left to offloading counts its 66 header bytes once per
    MTU-sized packet, like the kernel's qdisc accounting."""
    mss, segments, headers = 1448, 10, 14 + 20 + 32
    tcp_start = 14 + 20
    vnet = linkhub.VNET_HDR.pack(1, linkhub.VNET_GSO_TCPV4, headers, mss, tcp_start, 16)
    frame = bytearray(headers + segments * mss)
    frame[tcp_start + 12] = (32 // 4) << 4  # TCP data offset
    data = vnet + bytes(frame)
    assert linkhub.wire_bytes(data) == len(frame) + (segments - 1) * headers
    assert linkhub.wire_bytes(bytes(10) + bytes(100)) == 100


@pytest.mark.parametrize("text, value", [("1gbit", 1e9), ("100mbit", 1e8), ("10Mbit", 1e7),
                                         ("500kbit", 5e5), ("12.5mbps", 1e8), ("1000", 1e3)])
def test_parse_rate(text, value):
    assert linkhub.parse_rate(text) == pytest.approx(value)


@pytest.mark.parametrize("text, value", [("0.2ms", 2e-4), ("1ms", 1e-3), ("150us", 1.5e-4),
                                         ("1s", 1.0), ("0ms", 0.0), ("250", 2.5e-4)])
def test_parse_time(text, value):
    assert linkhub.parse_time(text) == pytest.approx(value)


@pytest.mark.parametrize("bad", ["fast", "1mbitx", "1 gigabit", "0mbit"])
def test_bad_rate_is_refused(bad):
    with pytest.raises(ValueError):
        linkhub.parse_rate(bad)
    result = launch([PYTHON, CLUSTER, "--link", "custom", "--rate", bad, "--", "true"])
    assert result.rc == 2 and "rate" in result.stderr, result.describe()
