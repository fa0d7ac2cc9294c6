"""What this process's control groups allow it: CPU quota and memory, cgroup v1 or v2.

A rank of experiments/cluster.py runs in a cgroup of its own with a CPU quota (v1 `cpu`
controller where mounted, else v2 cpu.max); a batch system or container may set one too.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator


def cores() -> float:
    """The CPU this process may use, in cores: the CPUs it may run on, or the CPU quota of its
    cgroup and of its parents, whichever is least."""
    limit = float(len(os.sched_getaffinity(0)))
    for group, v2 in own_groups("cpu"):
        for level in _up_to_root(group):
            quota = _cpu_quota(level, v2)
            if quota is not None:
                limit = min(limit, quota)
    return round(limit, 3)


def memory_left_mb() -> float | None:
    """What this process's own memory cgroup still allows beyond its use, in MB (None: no
    limit found)."""
    for group, v2 in own_groups("memory"):
        names = ("memory.max", "memory.current") if v2 else \
            ("memory.limit_in_bytes", "memory.usage_in_bytes")
        try:
            limit, used = ((group / name).read_text().strip() for name in names)
            if limit != "max":
                return (int(limit) - int(used)) / 2 ** 20
        except (OSError, ValueError):
            continue
    return None


def memory_limit_mb() -> float | None:
    """The memory this process may use at most, in MB: its memory cgroup's limit, or the
    machine's memory where none is set (None: neither is known)."""
    for group, v2 in own_groups("memory"):
        try:
            limit = (group / ("memory.max" if v2 else "memory.limit_in_bytes")).read_text()
            if limit.strip() != "max" and int(limit) < 2 ** 60:   # (v1: no limit is huge)
                return int(limit) / 2 ** 20
        except (OSError, ValueError):
            continue
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def own_groups(controller: str) -> Iterator[tuple[Path, bool]]:
    """(directory, is v2) of this process's cgroup for `controller`, in each hierarchy that
    has it mounted: v1 hierarchies naming the controller, and the v2 one."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
        mounts = _mounts()
    except OSError:
        return
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        v2 = parts[0] == "0" and parts[1] == ""
        if not v2 and controller not in parts[1].split(","):
            continue
        for root, mount_v2, options in mounts:
            if mount_v2 == v2 and (v2 or controller in options):
                yield root / parts[2].lstrip("/"), v2


def _mounts() -> list[tuple[Path, bool, set[str]]]:
    """(mount point, is v2, super options) of every cgroup file system mounted."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, rest = left.split(), right.split()
        if len(fields) > 4 and len(rest) > 2 and rest[0] in ("cgroup", "cgroup2"):
            out.append((Path(fields[4]), rest[0] == "cgroup2", set(rest[2].split(","))))
    return out


def _up_to_root(group: Path) -> Iterator[Path]:
    """The group and its parents, while they are cgroup directories."""
    while (group / "cgroup.procs").exists():
        yield group
        if group.parent == group:
            return
        group = group.parent


def _cpu_quota(group: Path, v2: bool) -> float | None:
    try:
        if v2:
            quota, period = (group / "cpu.max").read_text().split()
            return None if quota == "max" else int(quota) / int(period)
        quota = int((group / "cpu.cfs_quota_us").read_text())
        period = int((group / "cpu.cfs_period_us").read_text())
        return None if quota < 0 else quota / period
    except (OSError, ValueError):
        return None
