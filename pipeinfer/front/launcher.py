"""How the front starts a job and asks whether a host answers: the launcher's command line
(`mpiexec` beside pipeinfer's Python unless --mpiexec names another, e.g. the emulated
cluster's `experiments/cluster.py ... --as-mpiexec`), the hosts and how many ranks each holds,
the job's own options (the user's, less the front's), and a probe.

Hosts are given as MPICH's hydra takes them (`-hosts a:2,b` or a hostfile of `host[:slots]`
lines; Open MPI's `host slots=N` is read too). Ranks fill the hosts in order, `slots` each,
and wrap around, as hydra places them, so the front knows how many ranks a lost host held.
"""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

PROBE_S = 10.0   # a host whose probe takes longer does not answer


class LaunchError(ValueError):
    pass


@dataclass(frozen=True)
class Host:
    name: str
    slots: int = 1


def read_hostfile(path: str) -> list[Host]:
    """`host[:slots]` or `host slots=N` per line; # comments."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as err:
        raise LaunchError(f"cannot read the hostfile {path}: {err.strerror}") from None
    hosts = [parse_host(line.split("#")[0]) for line in lines if line.split("#")[0].strip()]
    if not hosts:
        raise LaunchError(f"the hostfile {path} names no host")
    return hosts


def parse_host(text: str) -> Host:
    text = text.strip()
    match = re.fullmatch(r"([^\s:]+)(?::(\d+)|\s+slots\s*=\s*(\d+))?(\s.*)?", text)
    if match is None:
        raise LaunchError(f"not a host: {text!r} (host, host:SLOTS or host slots=N)")
    slots = int(match.group(2) or match.group(3) or 1)
    if slots < 1:
        raise LaunchError(f"{text!r}: slots must be at least 1")
    return Host(match.group(1), slots)


def placement(hosts: list[Host], ranks: int) -> dict[str, int]:
    """Ranks each host holds when `ranks` fill `hosts` in order (slots each, wrapping)."""
    held = {h.name: 0 for h in hosts}
    left = ranks
    while left > 0:
        for host in hosts:
            take = min(host.slots, left)
            held[host.name] += take
            left -= take
            if left == 0:
                break
    return held


def default_mpiexec() -> list[str]:
    beside = shutil.which("mpiexec", path=str(Path(sys.executable).parent))
    found = beside or shutil.which("mpiexec")
    if found is None:
        raise LaunchError("no mpiexec beside pipeinfer's Python nor on PATH (name one with "
                          "--mpiexec)")
    return [found]


def pipeinfer_command() -> list[str]:
    script = Path(sys.executable).parent / "pipeinfer"
    return [str(script)] if script.exists() else [sys.executable, "-m", "pipeinfer"]


def placed(hosts: list[Host] | None, ranks: int) -> list[str]:
    """The host of each rank of a job of `ranks` launched on `hosts` (the launcher fills
    each host's slots in order); [] when the job runs on this machine alone."""
    if not hosts:
        return []
    names = [h.name for h in hosts for _ in range(max(h.slots, 1))]
    return [names[i % len(names)] for i in range(ranks)]


class Launcher:
    def __init__(self, mpiexec: str | None, ranks: int, hosts: list[Host] | None,
                 job_args: list[str]):
        self.mpiexec = shlex.split(mpiexec) if mpiexec else default_mpiexec()
        self.ranks, self.hosts, self.job_args = ranks, hosts, list(job_args)

    def command(self, address: str, hosts: list[Host] | None, ranks: int,
                replanned: bool) -> list[str]:
        """The launcher's command for a job of `ranks` on `hosts`, its head connecting to
        the front at `address`; `replanned`: the hosts changed, so the user's split (for
        another number of ranks) gives way to the planner's (`auto` with a --profile) or
        the default one."""
        placed = ["-hosts", ",".join(f"{h.name}:{h.slots}" for h in hosts)] if hosts else []
        args = without_split(self.job_args) if replanned else self.job_args
        return [*self.mpiexec, "-n", str(ranks), *placed, *pipeinfer_command(), "serve",
                "--channel", address, *args]

    async def probe(self, host: Host) -> bool:
        """Whether the launcher can start a process on `host` within PROBE_S."""
        proc = await asyncio.create_subprocess_exec(
            *self.mpiexec, "-n", "1", "-hosts", host.name, "true",
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
            start_new_session=True)
        try:
            return await asyncio.wait_for(proc.wait(), PROBE_S) == 0
        except asyncio.TimeoutError:
            kill_group(proc.pid, 9)
            await proc.wait()
            return False


def strip_options(args: list[str], names: tuple[str, ...]) -> list[str]:
    """`args` less the options `names` (each with a value: `--opt value` or `--opt=value`)."""
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg in names:
            skip = True
        elif not arg.startswith(tuple(f"{name}=" for name in names)):
            out.append(arg)
    return out


def without_split(args: list[str]) -> list[str]:
    """The job's options less --layer-split (and its value); `auto` when --profile is
    among them (the planner then splits for the ranks there are)."""
    out = strip_options(args, ("--layer-split",))
    if any(a == "--profile" or a.startswith("--profile=") for a in out):
        out += ["--layer-split", "auto"]
    return out


def kill_group(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass
