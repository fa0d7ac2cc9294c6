"""Emulate a small cluster on one machine: every MPI rank gets its own CPU quota (cgroups) and,
optionally, its own network namespace joined to the others by shaped links (rate, delay, jitter).

    python experiments/cluster.py --nodes 4 --cpu 0.5 --link gigabit -- \\
        pipeinfer run -m qwen-coder-1.5b -md qwen-coder-0.5b -p "..." --strategy pipeinfer

N ranks on two cores then behave like N slow nodes instead of fighting over the cores. Links
shape each rank's egress (a round trip costs 2 x delay): with tc netem on veth pairs where the
kernel has netem, else with a userspace forwarder between TAP devices (linkhub.py,
a thread of this process). Everything created (cgroups, namespaces, veths, TAP devices) is
removed afterwards, also on failure, Ctrl-C or SIGTERM. Needs root (cgroup v1 `cpu` controller
or cgroup v2 `cpu.max`; iproute2 for links).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from contextlib import ExitStack
from pathlib import Path

from . import CLUSTER, cluster_hosts, cluster_shim, linkhub, node_disks
from .cpu_quota import CpuQuotas, QuotaError, parse_cpus

LINK_PRESETS = {"gigabit": ("1gbit", "0.2ms", "0ms"), "slow": ("100mbit", "1ms", "0ms")}
SUBNET = "10.77.0"
FRONT_ADDRESS = "10.78.255.1"   # this machine, as every node reaches it (`serve --front-address`)


class ClusterError(RuntimeError):
    pass


# --- network namespaces ----------------------------------------------------------------------
def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise ClusterError(f"ip {' '.join(args)}: {result.stderr.strip()}")


def _tc(ns: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["tc", "-n", ns, *args], capture_output=True, text=True)


def parse_link(rate: str, delay: str, jitter: str) -> linkhub.Link:
    """Check the tc-syntax link parameters (whichever shaper ends up using them)."""
    try:
        return linkhub.Link(rate=linkhub.parse_rate(rate), delay=linkhub.parse_time(delay),
                            jitter=linkhub.parse_time(jitter))
    except ValueError as err:
        raise ClusterError(str(err)) from None


class Links:
    """Each rank's own network namespace (pi<job>r<rank>, eth0 = 10.77.0.<rank+1>/24), all on
    one Ethernet segment; every rank's egress is shaped (rate, one-way delay, jitter), so a
    round trip between two ranks costs 2 x delay. Three ways, the first that works is used:

    netem  veth pairs to a bridge in a hub namespace, netem on each rank's eth0 egress.
    tap    (kernels without netem) each rank's eth0 is a TAP device whose fd stays with this
           process, and linkhub.LinkHub, a forwarding thread, switches the frames between them,
           shaping each rank's egress like netem (see experiments/linkhub.py).
    htb    (no netem, no TAP) veth + bridge with an HTB rate limit only: no delay (warned).
    """

    SHAPERS = ("netem", "tap", "htb")

    def __init__(self, job: str, nodes: int, rate: str, delay: str, jitter: str,
                 shaper: str = "auto"):
        self.job, self.nodes = job[:6], nodes
        self.rate, self.delay, self.jitter = rate, delay, jitter
        self.shaper, self.used = shaper, None
        self.hub = f"pi{self.job}hub"
        self.linkhub: linkhub.LinkHub | None = None
        self.made_tun_node = False
        self.link = parse_link(rate, delay, jitter)

    def ns(self, rank: int) -> str:
        return f"pi{self.job}r{rank}"

    def address(self, rank: int) -> str:
        return f"{SUBNET}.{rank + 1}"

    def create(self) -> None:
        if shutil.which("ip") is None or shutil.which("tc") is None:
            raise ClusterError("iproute2 (ip, tc) is needed for --link")
        for rank in range(self.nodes):
            _ip("netns", "add", self.ns(rank))
            _ip("-n", self.ns(rank), "link", "set", "lo", "up")
        shaper = self.shaper
        if shaper == "auto":
            shaper = "netem" if self._has_netem() else "tap"
        if shaper == "tap":
            try:
                self._create_taps()
            except linkhub.LinkHubError as err:
                if self.shaper == "tap":
                    raise ClusterError(str(err)) from None
                shaper = "htb"
                print(f"cluster: warning: this kernel has no netem qdisc and no TAP devices "
                      f"({err}); links are rate-limited (HTB, {self.rate}) but the "
                      f"{self.delay} delay is not emulated", file=sys.stderr)
        if shaper in ("netem", "htb"):
            self._create_veths(shaper)
        self.used = shaper
        self._create_front_links()

    def _has_netem(self) -> bool:
        ns = self.ns(0)
        result = _tc(ns, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms")
        if result.returncode == 0:
            _tc(ns, "qdisc", "del", "dev", "lo", "root")
            return True
        if "unknown" not in result.stderr:
            raise ClusterError(f"tc netem: {result.stderr.strip()}")
        return False

    def _create_taps(self) -> None:
        self.made_tun_node = linkhub.ensure_tun_device()
        fds = linkhub.open_taps([f"/run/netns/{self.ns(r)}" for r in range(self.nodes)])
        links = [dataclasses.replace(self.link) for _ in range(self.nodes)]  # own counters
        self.linkhub = linkhub.LinkHub(fds, links)  # owns the fds from here on
        for rank in range(self.nodes):
            _ip("-n", self.ns(rank), "addr", "add", f"{self.address(rank)}/24", "dev", "eth0")
            _ip("-n", self.ns(rank), "link", "set", "eth0", "up")
        self.linkhub.start()

    def _create_veths(self, shaper: str) -> None:
        _ip("netns", "add", self.hub)
        _ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.hub, "link", "set", "br0", "up")
        for rank in range(self.nodes):
            ns, inner, outer = self.ns(rank), "eth0", f"v{rank}"
            _ip("-n", ns, "link", "add", inner, "type", "veth", "peer", "name", outer,
                "netns", self.hub)
            _ip("-n", ns, "addr", "add", f"{self.address(rank)}/24", "dev", inner)
            _ip("-n", ns, "link", "set", inner, "up")
            _ip("-n", self.hub, "link", "set", outer, "master", "br0")
            _ip("-n", self.hub, "link", "set", outer, "up")
            if shaper == "netem":
                self._netem(ns, inner)
            else:
                self._htb(ns, inner)

    def _create_front_links(self) -> None:
        """Each node's own unshaped link to this machine (its `front` device), on which it
        reaches FRONT_ADDRESS: where a front started here listens for the job's head, as a
        front on a machine of the user's network would. The node's address on it is the
        job's own (a relaunched job's cluster may exist beside the ending one's)."""
        subnet = f"10.78.{int(self.job, 16) % 250}"
        for rank in range(self.nodes):
            ns, outer, node = self.ns(rank), f"pi{self.job}f{rank}", f"{subnet}.{rank + 2}"
            _ip("link", "add", outer, "type", "veth", "peer", "name", "front", "netns", ns)
            _ip("addr", "add", f"{FRONT_ADDRESS}/32", "peer", f"{node}/32", "dev", outer)
            _ip("link", "set", outer, "up")
            _ip("-n", ns, "addr", "add", f"{node}/32", "peer", f"{FRONT_ADDRESS}/32", "dev",
                "front")
            _ip("-n", ns, "link", "set", "front", "up")

    def _netem(self, ns: str, dev: str) -> None:
        """netem (delay, jitter, rate) on the rank's egress."""
        netem = ["qdisc", "add", "dev", dev, "root", "netem", "delay", self.delay]
        if self.link.jitter:
            netem.append(self.jitter)
        result = _tc(ns, *netem, "rate", self.rate)
        if result.returncode != 0:
            raise ClusterError(f"tc netem: {result.stderr.strip()}")

    def _htb(self, ns: str, dev: str) -> None:
        for cmd in (["qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "10"],
                    ["class", "add", "dev", dev, "parent", "1:", "classid", "1:10", "htb",
                     "rate", self.rate]):
            result = _tc(ns, *cmd)
            if result.returncode != 0:
                raise ClusterError(f"tc {' '.join(cmd)}: {result.stderr.strip()}")

    def summary(self) -> str | None:
        """What the userspace forwarder moved (None for kernel shapers)."""
        if self.linkhub is None:
            return None
        ranks = "; ".join(f"rank {r}: {link.frames} frames {link.bytes / 1e6:.2f} MB"
                          + (f" ({link.drops} dropped)" if link.drops else "")
                          for r, link in enumerate(self.linkhub.links))
        cpu = self.linkhub.cpu_time()
        return f"link forwarder sent {ranks}" + ("" if cpu is None else f"; {cpu:.2f} s of CPU")

    def check(self) -> None:
        """Raise if the forwarder thread has died (its links would be dead too)."""
        if self.linkhub is not None and self.linkhub.errors:
            raise ClusterError(f"link forwarder failed: {self.linkhub.errors[0]}")

    def remove(self) -> None:
        if self.linkhub is not None:  # closing the fds removes the TAP devices
            self.linkhub.stop()
        for name in [self.ns(r) for r in range(self.nodes)] + [self.hub]:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        if self.made_tun_node:
            try:
                os.unlink(linkhub.TUN_PATH)
            except OSError:
                pass


# --- the launcher ----------------------------------------------------------------------------
class Terminated(BaseException):
    """SIGTERM or SIGHUP arrived: unwind like Ctrl-C, so that everything is cleaned up."""


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _ignore_stop_signals() -> None:
    for other in STOP_SIGNALS:  # a second signal must not cut the cleanup
        signal.signal(other, signal.SIG_IGN)


def _terminate(signum, frame):
    _ignore_stop_signals()
    raise Terminated(signum)


def _interrupt(signum, frame):
    _ignore_stop_signals()
    raise KeyboardInterrupt


def launch(args: argparse.Namespace) -> int:
    hosts = None
    if args.as_mpiexec:   # named hosts, some maybe down (cluster_hosts.py)
        args.nodes, hosts, args.command = cluster_hosts.parse_mpiexec(args.command)
        cluster_hosts.check_reachable(args.state, hosts)
        if args.command == ["true"]:   # the front's probe: the host answers
            return 0
    if not args.command:
        raise ClusterError("give the command to run after --")
    rate, delay, jitter = LINK_PRESETS.get(args.link, (args.rate, args.delay, args.jitter))
    if args.link != "none":
        parse_link(rate, delay, jitter)
    if os.geteuid() != 0:
        raise ClusterError("the cluster emulation needs root (cgroups, network namespaces)")
    job = uuid.uuid4().hex[:6]
    mpiexec = args.mpiexec or shutil.which("mpiexec", path=str(Path(sys.executable).parent)) \
        or shutil.which("mpiexec")
    env = dict(os.environ)
    shim = [sys.executable, str(CLUSTER), "_rank"]
    links = None
    with ExitStack() as cleanup:
        for signum in STOP_SIGNALS:
            handler = _interrupt if signum == signal.SIGINT else _terminate
            cleanup.callback(signal.signal, signum, signal.signal(signum, handler))
        quotas = CpuQuotas(job, parse_cpus(args), args.period_us)
        cleanup.callback(quotas.remove)
        quotas.create()
        shim += ["--cgroup", str(quotas.root)]
        shim += node_disks.setup(args, job, cleanup)
        if not args.shared_kernel:
            shim += ["--host-id", job]
        if args.link != "none":
            links = Links(job, args.nodes, rate, delay, jitter, args.shaper)
            cleanup.callback(links.remove)
            links.create()
            if args.verbose and links.linkhub is not None:
                cleanup.callback(lambda: print(f"cluster: {links.summary()}", file=sys.stderr))
            shim += ["--netns", f"pi{links.job}"]
            # Ranks share a hostname: make MPICH talk over the network, not shared memory.
            env.update(MPIR_CVAR_NOLOCAL="1", MPIR_CVAR_CH4_NETMOD="ofi", FI_PROVIDER="tcp",
                       FI_TCP_IFACE="eth0", FI_SOCKETS_IFACE="eth0")
            if args.verbose:
                shaping = f"rate {rate} only, no delay" if links.used == "htb" else \
                    f"rate {rate}, delay {delay}, jitter {jitter}"
                print(f"cluster: links shaped by {links.used}: {shaping} on each node's egress",
                      file=sys.stderr)
        if hosts is not None:
            shim += cluster_hosts.shim_args(args.state, hosts)
        command = [mpiexec, "-n", str(args.nodes)] + shim + ["--"] + args.command
        if args.verbose:
            print("cluster: " + " ".join(command), file=sys.stderr)
        proc = subprocess.Popen(command, env=env, start_new_session=True)
        if hosts is not None and args.state:
            watcher = cluster_hosts.Watcher(args.state, hosts,
                                            f"pi{links.job}" if links else None)
            watcher.start()
            cleanup.callback(watcher.stop)
        return _run_job(proc, args.timeout, links)


def _run_job(proc: subprocess.Popen, timeout: float, links: Links | None) -> int:
    """Wait for the launched job; on a signal, a timeout or a dead link forwarder, interrupt it
    (SIGKILL 10 s later) and pass the reason on."""
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                return proc.wait(timeout=max(0.0, min(1.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                if time.monotonic() >= deadline:
                    raise
                if links is not None:
                    links.check()  # a dead link forwarder would leave the job hanging
    except (KeyboardInterrupt, Terminated, ClusterError, subprocess.TimeoutExpired) as err:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if isinstance(err, subprocess.TimeoutExpired):
            raise ClusterError(f"the job exceeded --timeout {timeout} s") from None
        if isinstance(err, (ClusterError, Terminated)):
            raise
        return 130


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_rank"]:
        return cluster_shim.main(argv[1:])
    # Explicitly, not Python's default: started from a non-interactive shell's background job
    # (`nohup ... &`) a process inherits SIGINT ignored, Python then installs no handler, and
    # Ctrl-C (or the SIGINT a test sends) would be lost while the job runs on.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=4, help="MPI ranks (emulated nodes)")
    parser.add_argument("--cpu", type=float, default=0.5, help="CPU quota per node, in cores")
    parser.add_argument("--cpus", help="per-node quotas, comma-separated (heterogeneous cluster)")
    parser.add_argument("--period-us", type=int, default=None,
                        help="CFS period of the quotas (default: the shortest the kernel "
                             "allows for them, 2 ms at 0.5 core: a node idle before a burst "
                             "runs it faster than its quota for up to about a period)")
    parser.add_argument("--link", default="none", choices=["none", "gigabit", "slow", "custom"],
                        help="network between nodes: none (shared memory), gigabit "
                             "(1 Gbit/s, 0.2 ms each way), slow (100 Mbit/s, 1 ms each way), "
                             "custom (--rate, --delay, --jitter)")
    parser.add_argument("--rate", default="1gbit", help="custom link rate (tc syntax)")
    parser.add_argument("--delay", default="0.2ms", help="custom link delay per direction (a "
                        "round trip between two nodes costs twice)")
    parser.add_argument("--jitter", default="0ms", help="custom link jitter (uniform, +-)")
    parser.add_argument("--shaper", default="auto", choices=["auto", *Links.SHAPERS],
                        help="how links are emulated: netem (tc, in the kernel), tap (a "
                             "userspace forwarder between TAP devices, for kernels without "
                             "netem), htb (rate limit only, no delay); auto = netem if the "
                             "kernel has it, else tap, else htb")
    node_disks.add_arguments(parser)
    cluster_hosts.add_arguments(parser)
    parser.add_argument("--shared-kernel", action="store_true",
                        help="let ranks wake each other through this kernel's Unix "
                             "sockets (engine/transport/wakeup.py), as ranks on one host do; "
                             "by default every node is a machine of its own, woken by the "
                             "others over UDP (engine/transport/wakeup_net.py: through "
                             "--link's shaped links if given, else this host's addresses)")
    parser.add_argument("--mpiexec", help="mpiexec to use (default: the one beside python)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds before the job is "
                        "interrupted")
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- command to run")
    rest = argv.index("--as-mpiexec") + 1 if "--as-mpiexec" in argv else len(argv)
    args = parser.parse_args(argv[:rest])   # (mpiexec's own options after --as-mpiexec)
    args.command = args.command + argv[rest:]
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    try:
        return launch(args)
    except cluster_hosts.HostError as err:
        print(f"cluster: error: {err}", file=sys.stderr)
        return cluster_hosts.UNREACHABLE
    except (ClusterError, QuotaError, node_disks.NodeError) as err:
        print(f"cluster: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Terminated as err:
        return 128 + err.args[0]

