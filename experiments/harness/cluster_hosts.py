"""cluster.py as an mpiexec the front of `pipeinfer serve --ranks N --mpiexec ...` launches
through: named hosts (node0, node1, ...) that can go away and come back.

    python experiments/cluster.py --cpu 0.5 --link gigabit --state DIR --as-mpiexec \\
        -n 3 -hosts node0,node1,node3 CMD ...

starts CMD as 3 emulated nodes (each rank its own node, in host order). A host is down while
the file DIR/down/HOST exists: then a launch naming it fails at once, as a launcher that
cannot reach a host does (`cluster: node2: unreachable (its link is down)`, status 255), and
a job already running on it loses that node: its link goes down and its rank is killed, as
when a machine loses power. `-n 1 -hosts HOST true` is the front's probe: status 0 when
HOST is up. The shim records each rank's pid in DIR/pids/HOST.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from pathlib import Path

UNREACHABLE = 255
WATCH_S = 0.1


class HostError(RuntimeError):
    pass


def add_arguments(parser) -> None:
    parser.add_argument("--state", help="with --as-mpiexec: the hosts' state directory "
                        "(DIR/down/HOST: the host is down)")
    parser.add_argument("--as-mpiexec", action="store_true", help="take mpiexec's -n N "
                        "[-hosts a,b,...] before the command: named hosts (node0, node1, ...) "
                        "that --state can take down (see experiments/cluster_hosts.py)")


def parse_mpiexec(rest: list[str]) -> tuple[int, list[str], list[str]]:
    """(-n, the hosts of ranks 0..n-1, the command) from mpiexec-style arguments."""
    n, hosts, i = None, None, 0
    while i < len(rest) and rest[i].startswith("-"):
        flag = rest[i]
        if flag == "--":
            i += 1
            break
        if i + 1 >= len(rest):
            raise HostError(f"{flag} needs a value")
        if flag in ("-n", "-np"):
            n = int(rest[i + 1])
        elif flag in ("-hosts", "-host"):
            hosts = [h.split(":")[0] for h in rest[i + 1].split(",") if h]
        else:
            raise HostError(f"--as-mpiexec takes -n and -hosts, not {flag}")
        i += 2
    if n is None or n < 1:
        raise HostError("--as-mpiexec needs -n N (N >= 1)")
    hosts = hosts or [f"node{r}" for r in range(n)]
    return n, [hosts[r % len(hosts)] for r in range(n)], rest[i:]


def down(state: str | None, host: str) -> bool:
    return state is not None and (Path(state) / "down" / host).exists()


def check_reachable(state: str | None, hosts: list[str]) -> None:
    for host in dict.fromkeys(hosts):
        if down(state, host):
            raise HostError(f"{host}: unreachable (its link is down)")


def shim_args(state: str | None, hosts: list[str]) -> list[str]:
    return ["--state", state, "--host-names", ",".join(hosts)] if state else []


def record_pid(state: str | None, names: str | None, rank: int) -> None:
    """In the rank's shim: its pid (kept by exec) under its host's name."""
    if not state or not names:
        return
    pids = Path(state) / "pids"
    pids.mkdir(parents=True, exist_ok=True)
    (pids / names.split(",")[rank]).write_text(str(os.getpid()))


class Watcher(threading.Thread):
    """While a job runs: a host of it marked down loses its link and its rank."""

    def __init__(self, state: str, hosts: list[str], netns: str | None):
        super().__init__(daemon=True, name="hosts")
        self.state, self.hosts, self.netns = state, hosts, netns
        self.stopped = threading.Event()

    def run(self) -> None:
        alive = set(range(len(self.hosts)))
        while not self.stopped.wait(WATCH_S):
            for rank in sorted(alive):
                if down(self.state, self.hosts[rank]):
                    alive.discard(rank)
                    self._cut(rank)

    def _cut(self, rank: int) -> None:
        if self.netns is not None:   # its links to the other nodes and to this machine
            for dev in ("eth0", "front"):
                subprocess.run(["ip", "-n", f"{self.netns}r{rank}", "link", "set", dev, "down"],
                               capture_output=True)
        try:
            pid = int((Path(self.state) / "pids" / self.hosts[rank]).read_text())
            os.kill(pid, signal.SIGKILL)
        except (OSError, ValueError):
            pass

    def stop(self) -> None:
        self.stopped.set()
