"""Per-rank CPU quotas through cgroups, for the emulated cluster (experiments/cluster.py).

One cgroup per rank under a job's group, quota = cores x period: the cgroup v1 `cpu`
controller (cpu.cfs_quota_us / cpu.cfs_period_us) where it is mounted, else cgroup v2
(cpu.max). A short period (10 ms by default in cluster.py) keeps a throttled rank from
stalling for 100 ms bursts. Needs root.
"""

from __future__ import annotations

import os
from pathlib import Path

CGROUP_V1 = Path("/sys/fs/cgroup/cpu")
CGROUP_V2 = Path("/sys/fs/cgroup")


# The CFS period every emulated cluster uses unless told otherwise (10 ms: a throttled rank
# stalls for short bursts, not the kernel default's 100 ms).
PERIOD_US = 10_000


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
    """One cgroup per rank with quota = cpus[rank] x period."""

    def __init__(self, job: str, cpus: list[float], period_us: int):
        self.job, self.cpus, self.period_us = job, cpus, period_us
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
    if any(c * args.period_us < 1000 for c in cpus):
        raise QuotaError(f"a quota of {min(cpus)} cores is under the kernel's minimum of 1 ms "
                           f"per {args.period_us} us period; raise --period-us")
    return cpus
