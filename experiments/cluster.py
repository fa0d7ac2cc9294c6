#!/usr/bin/env python3
"""Emulate a small cluster on one machine: every MPI rank gets its own CPU quota (cgroups) and,
optionally, its own network namespace joined to the others by shaped veth links (tc netem).

    python experiments/cluster.py --nodes 4 --cpu 0.5 --link gigabit -- \\
        pipeinfer run -m qwen-coder-1.5b -md qwen-coder-0.5b -p "..." --strategy pipeinfer

N ranks on two cores then behave like N slow nodes instead of fighting over the cores.
Everything created (cgroups, namespaces, veths) is removed afterwards, also on failure or
Ctrl-C. Needs root (cgroup v1 `cpu` controller or cgroup v2 `cpu.max`; iproute2 for links).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import uuid
from contextlib import ExitStack
from pathlib import Path

LINK_PRESETS = {"gigabit": ("1gbit", "0.2ms", "0ms"), "slow": ("100mbit", "1ms", "0ms")}
CGROUP_V1 = Path("/sys/fs/cgroup/cpu")
CGROUP_V2 = Path("/sys/fs/cgroup")
SUBNET = "10.77.0"


class ClusterError(RuntimeError):
    pass


# --- CPU quotas ------------------------------------------------------------------------------
class CpuQuotas:
    """One cgroup per rank with quota = cpus x period."""

    def __init__(self, job: str, cpus: list[float], period_us: int):
        self.job, self.cpus, self.period_us = job, cpus, period_us
        if (CGROUP_V1 / "cpu.cfs_quota_us").exists():
            self.root, self.v2 = CGROUP_V1 / f"pipeinfer-{job}", False
        elif (CGROUP_V2 / "cgroup.controllers").exists():
            self.root, self.v2 = CGROUP_V2 / f"pipeinfer-{job}", True
        else:
            raise ClusterError("no writable cgroup cpu controller (v1 cpu or v2 cpu.max)")

    def create(self) -> None:
        try:
            self.root.mkdir()
            if self.v2:
                (self.root / "cgroup.subtree_control").write_text("+cpu")
            for rank, cpu in enumerate(self.cpus):
                group = self.rank_dir(rank)
                group.mkdir()
                quota = int(cpu * self.period_us)
                if self.v2:
                    (group / "cpu.max").write_text(f"{quota} {self.period_us}")
                else:
                    (group / "cpu.cfs_period_us").write_text(str(self.period_us))
                    (group / "cpu.cfs_quota_us").write_text(str(quota))
        except OSError as err:
            raise ClusterError(f"cannot set up cgroups under {self.root.parent}: {err}") from None

    def rank_dir(self, rank: int) -> Path:
        return self.root / f"rank{rank}"

    def remove(self) -> None:
        for rank in range(len(self.cpus)):
            _rmdir_cgroup(self.rank_dir(rank))
        _rmdir_cgroup(self.root)


def _rmdir_cgroup(path: Path) -> None:
    if not path.exists():
        return
    leftover = (path / "cgroup.procs").read_text().split() if (path / "cgroup.procs").exists() else []
    for pid in leftover:  # stray processes of a failed job: move them back to the root group
        try:
            (path.parent.parent / "cgroup.procs").write_text(pid)
        except OSError:
            pass
    try:
        path.rmdir()
    except OSError:
        pass


# --- network namespaces ----------------------------------------------------------------------
def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise ClusterError(f"ip {' '.join(args)}: {result.stderr.strip()}")


class Links:
    """A hub namespace with a bridge; each rank's namespace joins it through a shaped veth."""

    def __init__(self, job: str, nodes: int, rate: str, delay: str, jitter: str):
        self.job, self.nodes = job[:6], nodes
        self.rate, self.delay, self.jitter = rate, delay, jitter
        self.hub = f"pi{self.job}hub"
        self.warned = False

    def ns(self, rank: int) -> str:
        return f"pi{self.job}r{rank}"

    def address(self, rank: int) -> str:
        return f"{SUBNET}.{rank + 1}"

    def create(self) -> None:
        if shutil.which("ip") is None or shutil.which("tc") is None:
            raise ClusterError("iproute2 (ip, tc) is needed for --link")
        _ip("netns", "add", self.hub)
        _ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.hub, "link", "set", "br0", "up")
        for rank in range(self.nodes):
            ns, inner, outer = self.ns(rank), "eth0", f"v{rank}"
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "link", "add", inner, "type", "veth", "peer", "name", outer,
                "netns", self.hub)
            _ip("-n", ns, "addr", "add", f"{self.address(rank)}/24", "dev", inner)
            _ip("-n", ns, "link", "set", inner, "up")
            _ip("-n", self.hub, "link", "set", outer, "master", "br0")
            _ip("-n", self.hub, "link", "set", outer, "up")
            self._shape(ns, inner)

    def _shape(self, ns: str, dev: str) -> None:
        """netem (delay, jitter, rate) on the rank's egress; kernels without netem get an HTB
        rate limit only, and the missing delay is reported."""
        netem = ["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "netem", "delay", self.delay]
        if self.jitter not in ("0", "0ms"):
            netem.append(self.jitter)
        result = subprocess.run(netem + ["rate", self.rate], capture_output=True, text=True)
        if result.returncode == 0:
            return
        if "unknown" not in result.stderr:
            raise ClusterError(f"tc netem: {result.stderr.strip()}")
        if not self.warned:
            print("cluster: warning: this kernel has no netem qdisc; links are rate-limited "
                  f"(HTB, {self.rate}) but the {self.delay} delay is not emulated",
                  file=sys.stderr)
            self.warned = True
        for cmd in (["qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "10"],
                    ["class", "add", "dev", dev, "parent", "1:", "classid", "1:10", "htb",
                     "rate", self.rate]):
            result = subprocess.run(["tc", "-n", ns, *cmd], capture_output=True, text=True)
            if result.returncode != 0:
                raise ClusterError(f"tc {' '.join(cmd)}: {result.stderr.strip()}")

    def remove(self) -> None:
        for name in [self.ns(r) for r in range(self.nodes)] + [self.hub]:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


# --- the per-rank shim -----------------------------------------------------------------------
def rank_shim(args: argparse.Namespace) -> None:
    """Runs as each MPI rank: join the rank's cgroup (and namespace), then exec the command."""
    rank = int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
    if args.cgroup:
        (Path(args.cgroup) / f"rank{rank}" / "cgroup.procs").write_text(str(os.getpid()))
    command = args.command
    if args.netns:
        command = ["nsenter", f"--net=/run/netns/{args.netns}r{rank}", "--"] + command
    try:
        os.execvp(command[0], command)
    except OSError as err:
        print(f"cluster: rank {rank}: cannot run {command[0]}: {err.strerror}", file=sys.stderr)
        sys.exit(127)


# --- the launcher ----------------------------------------------------------------------------
def parse_cpus(args: argparse.Namespace) -> list[float]:
    if args.cpus:
        cpus = [float(c) for c in args.cpus.split(",")]
        if len(cpus) != args.nodes:
            raise ClusterError(f"--cpus has {len(cpus)} values for {args.nodes} nodes")
    else:
        cpus = [args.cpu] * args.nodes
    if any(c <= 0 for c in cpus):
        raise ClusterError("CPU quotas must be positive")
    if any(c * args.period_us < 1000 for c in cpus):
        raise ClusterError(f"a quota of {min(cpus)} cores is under the kernel's minimum of 1 ms "
                           f"per {args.period_us} us period; raise --period-us")
    return cpus


def launch(args: argparse.Namespace) -> int:
    if os.geteuid() != 0:
        raise ClusterError("the cluster emulation needs root (cgroups, network namespaces)")
    if not args.command:
        raise ClusterError("give the command to run after --")
    job = uuid.uuid4().hex[:6]
    mpiexec = args.mpiexec or shutil.which("mpiexec", path=str(Path(sys.executable).parent)) \
        or shutil.which("mpiexec")
    env = dict(os.environ)
    shim = [sys.executable, os.path.abspath(__file__), "_rank"]
    with ExitStack() as cleanup:
        quotas = CpuQuotas(job, parse_cpus(args), args.period_us)
        cleanup.callback(quotas.remove)
        quotas.create()
        shim += ["--cgroup", str(quotas.root)]
        if args.link != "none":
            rate, delay, jitter = LINK_PRESETS.get(args.link, (args.rate, args.delay, args.jitter))
            links = Links(job, args.nodes, rate, delay, jitter)
            cleanup.callback(links.remove)
            links.create()
            shim += ["--netns", f"pi{links.job}"]
            # Ranks share a hostname: make MPICH talk over the network, not shared memory.
            env.update(MPIR_CVAR_NOLOCAL="1", MPIR_CVAR_CH4_NETMOD="ofi", FI_PROVIDER="tcp",
                       FI_TCP_IFACE="eth0", FI_SOCKETS_IFACE="eth0")
        command = [mpiexec, "-n", str(args.nodes)] + shim + ["--"] + args.command
        if args.verbose:
            print("cluster: " + " ".join(command), file=sys.stderr)
        proc = subprocess.Popen(command, env=env, start_new_session=True)
        try:
            return proc.wait(timeout=args.timeout)
        except (KeyboardInterrupt, subprocess.TimeoutExpired) as err:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            if isinstance(err, subprocess.TimeoutExpired):
                raise ClusterError(f"the job exceeded --timeout {args.timeout} s") from None
            return 130


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_rank"]:
        shim = argparse.ArgumentParser(prog="cluster.py _rank")
        shim.add_argument("--cgroup")
        shim.add_argument("--netns")
        shim.add_argument("command", nargs=argparse.REMAINDER)
        args = shim.parse_args(argv[1:])
        if args.command[:1] == ["--"]:
            args.command = args.command[1:]
        rank_shim(args)
        return 1  # exec failed
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=4, help="MPI ranks (emulated nodes)")
    parser.add_argument("--cpu", type=float, default=0.5, help="CPU quota per node, in cores")
    parser.add_argument("--cpus", help="per-node quotas, comma-separated (heterogeneous cluster)")
    parser.add_argument("--period-us", type=int, default=10000,
                        help="CFS period; short periods avoid 100 ms throttling bursts")
    parser.add_argument("--link", default="none", choices=["none", "gigabit", "slow", "custom"],
                        help="network between nodes: none (shared memory), gigabit "
                             "(1 Gbit/s, 0.2 ms), slow (100 Mbit/s, 1 ms), custom")
    parser.add_argument("--rate", default="1gbit", help="custom link rate (tc syntax)")
    parser.add_argument("--delay", default="0.2ms", help="custom link delay per direction")
    parser.add_argument("--jitter", default="0ms", help="custom link jitter")
    parser.add_argument("--mpiexec", help="mpiexec to use (default: the one beside python)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds before the job is "
                        "interrupted")
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- command to run")
    args = parser.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    try:
        return launch(args)
    except ClusterError as err:
        print(f"cluster: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
