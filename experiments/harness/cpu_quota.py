"""Per-rank CPU quotas through cgroups, for the emulated cluster (experiments/cluster.py).

One cgroup per rank under a job's group, quota = cores x period: the cgroup v1 `cpu`
controller (cpu.cfs_quota_us / cpu.cfs_period_us) where it is mounted, else cgroup v2
(cpu.max). Needs root.

The period is the shortest the kernel allows for the quotas (fitted_period_us). A node idle
before a burst of work finds a whole period's quota there and runs the burst faster than its
quota says, by up to about a period: on the EPYC Genoa host, 15 ms of CPU after an idle spell
took 20 ms of wall time at 0.5 core under a 10 ms period, 28 ms under 2 ms, and 30 ms back to
back. A long period thus makes an emulated slow node fast whenever it waits between bursts,
which favours systems that use one node at a time (iterative, llama.cpp's RPC backend) over
pipelines, whose nodes are busy together.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_V1 = Path("/sys/fs/cgroup/cpu")
CGROUP_V2 = Path("/sys/fs/cgroup")


# The kernel's least CFS quota and period (cgroup v1 and v2 alike).
MIN_QUOTA_US = 1_000
MIN_PERIOD_US = 1_000


def fitted_period_us(cpus: list[float]) -> int:
    """The shortest period at which every quota of `cpus` cores is the kernel's minimum or
    more: 2 ms for half-core nodes, 4 ms for quarter-core ones."""
    return max(MIN_PERIOD_US, math.ceil(MIN_QUOTA_US / min(cpus)))


def host_cpu() -> str:
    """The host's CPU model, as benchmarks name the host beside their tables."""
    with open("/proc/cpuinfo") as info:
        return next((line.split(":", 1)[1].strip() for line in info
                     if line.startswith("model name")), "?")


class QuotaError(RuntimeError):
    pass


def controller() -> tuple[Path, bool]:
    """The cgroup directory with a cpu controller, and whether it is cgroup v2."""
    if (CGROUP_V1 / "cpu.cfs_quota_us").exists():
        return CGROUP_V1, False
    controllers = CGROUP_V2 / "cgroup.controllers"
    if controllers.exists() and "cpu" in controllers.read_text().split():
        return CGROUP_V2, True
    raise QuotaError("no cgroup cpu controller (v1 /sys/fs/cgroup/cpu or v2 cpu.max)")


def join_quota(job_root: Path, rank: int) -> None:
    """Move the calling process into rank `rank`'s group of the job at `job_root`."""
    (job_root / f"rank{rank}" / "cgroup.procs").write_text(str(os.getpid()))


class CpuQuotas:
    """One cgroup per rank with quota = cpus[rank] x period (None: fitted_period_us)."""

    def __init__(self, job: str, cpus: list[float], period_us: int | None = None):
        self.job, self.cpus = job, cpus
        self.period_us = period_us or fitted_period_us(cpus)
        parent, self.v2 = controller()
        self.root = parent / f"pipeinfer-{job}"

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
            raise QuotaError(f"cannot set up cgroups under {self.root.parent}: {err}") from None

    def rank_dir(self, rank: int) -> Path:
        return self.root / f"rank{rank}"

    def remove(self) -> None:
        for rank in range(len(self.cpus)):
            _rmdir_cgroup(self.rank_dir(rank))
        _rmdir_cgroup(self.root)


def _rmdir_cgroup(path: Path) -> None:
    if not path.exists():
        return
    procs = path / "cgroup.procs"
    leftover = procs.read_text().split() if procs.exists() else []
    for pid in leftover:  # stray processes of a failed job: move them back to the root group
        try:
            (path.parent.parent / "cgroup.procs").write_text(pid)
        except OSError:
            pass
    try:
        path.rmdir()
    except OSError:
        pass


def parse_cpus(args) -> list[float]:
    if args.cpus:
        cpus = [float(c) for c in args.cpus.split(",")]
        if len(cpus) != args.nodes:
            raise QuotaError(f"--cpus has {len(cpus)} values for {args.nodes} nodes")
    else:
        cpus = [args.cpu] * args.nodes
    if any(c <= 0 for c in cpus):
        raise QuotaError("CPU quotas must be positive")
    if args.period_us and any(c * args.period_us < MIN_QUOTA_US for c in cpus):
        raise QuotaError(f"a quota of {min(cpus)} cores is under the kernel's minimum of 1 ms "
                           f"per {args.period_us} us period; raise --period-us")
    return cpus
