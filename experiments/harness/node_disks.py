"""Separate machines on one box, for experiments/cluster.py: every node but node 0 gets a disk
of its own (a private pipeinfer cache, and no view of the model files), and every node can get
a memory limit of its own (a memory cgroup per rank), as if it were a machine with that much
memory.

Disks: a rank on node r >= 1 runs in a mount namespace of its own in which the user's
pipeinfer cache (PIPEINFER_CACHE, or ~/.cache/pipeinfer) and every file or directory named by
--hide are covered (directories by an empty tmpfs, files by /dev/null), and PIPEINFER_CACHE
points at <root>/node<r>/cache: the disk belongs to the node, whichever rank runs there (a
job relaunched without a lost node has other ranks on the others). Node 0 keeps the real
cache and files: it is the machine with the model.
With a --disk-root that outlives the job, a later job finds each node's cache as it was left.

Memory: cgroup v1 `memory` (memory.limit_in_bytes; max_usage_in_bytes read afterwards) or
cgroup v2 (memory.max; memory.peak where the kernel has it). A limit of 0 accounts without
limiting. Needs root.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CLONE_NEWNS = 0x00020000
MEMORY_V1 = Path("/sys/fs/cgroup/memory")
MEMORY_V2 = Path("/sys/fs/cgroup")


class NodeError(RuntimeError):
    pass


def user_cache() -> Path:
    env = os.environ.get("PIPEINFER_CACHE")
    if env:
        return Path(env).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "pipeinfer"


def node_cache(root: Path, host: str) -> Path:
    return root / host / "cache"


def model_files(command: list[str]) -> list[str]:
    """The existing files the command names after -m/-md/--model/--draft (what a node
    without the model must not see)."""
    found = []
    for flag, value in zip(command, command[1:]):
        if flag in ("-m", "-md", "--model", "--draft") and os.path.isfile(value):
            found += [os.path.abspath(value), os.path.realpath(value)]
    return list(dict.fromkeys(found))


def private_disk(host: str, root: Path, hide: list[str]) -> None:
    """In the calling process (a rank about to exec its command): a mount namespace of its
    own in which the user's cache and `hide` are covered, and PIPEINFER_CACHE set to the
    node's own cache directory."""
    cache = node_cache(root, host)
    cache.mkdir(parents=True, exist_ok=True)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNS) != 0:
        raise NodeError(f"unshare(CLONE_NEWNS): {os.strerror(ctypes.get_errno())}")
    _mount("--make-rprivate", "/")
    hidden = list(dict.fromkeys(os.path.realpath(p) for p in [str(user_cache())] + hide))
    for path in [p for p in hidden if os.path.isfile(p)]:  # files first: a directory
        _mount("--bind", "/dev/null", path)                 # covered next may hold them
    for path in sorted(p for p in hidden if os.path.isdir(p)):
        if os.path.isdir(path):  # (not inside a directory covered already)
            _mount("-t", "tmpfs", "-o", "size=1m,mode=755", "none", path)
    os.environ["PIPEINFER_CACHE"] = str(cache)


def _mount(*args: str) -> None:
    result = subprocess.run(["mount", *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise NodeError(f"mount {' '.join(args)}: {result.stderr.strip()}")


class MemoryLimits:
    """One memory cgroup per rank (limit in MB, 0 = none), created and removed with the job."""

    def __init__(self, job: str, limits_mb: list[int]):
        self.limits = limits_mb
        self.v2 = not (MEMORY_V1 / "memory.limit_in_bytes").exists()
        parent = MEMORY_V2 if self.v2 else MEMORY_V1
        self.root = parent / f"pipeinfer-mem-{job}"

    def create(self) -> None:
        try:
            self.root.mkdir()
            if self.v2:
                (self.root / "cgroup.subtree_control").write_text("+memory")
            for rank, mb in enumerate(self.limits):
                group = self.root / f"rank{rank}"
                group.mkdir()
                if mb > 0:
                    limit = str(mb << 20)
                    name = "memory.max" if self.v2 else "memory.limit_in_bytes"
                    (group / name).write_text(limit)
                    if self.v2:
                        (group / "memory.swap.max").write_text("0")
        except OSError as err:
            raise NodeError(f"cannot set up memory cgroups under {self.root.parent}: "
                            f"{err}") from None

    def peaks_mb(self) -> list[float | None]:
        """Each rank's peak charge (MB), as the kernel recorded it (None if it does not)."""
        name = "memory.peak" if self.v2 else "memory.max_usage_in_bytes"
        peaks = []
        for rank in range(len(self.limits)):
            try:
                peaks.append(int((self.root / f"rank{rank}" / name).read_text()) / 2 ** 20)
            except (OSError, ValueError):
                peaks.append(None)
        return peaks

    def failcounts(self) -> list[int]:
        """Times each rank hit its limit (cgroup v1's memory.failcnt; v2: the max events)."""
        counts = []
        for rank in range(len(self.limits)):
            group = self.root / f"rank{rank}"
            try:
                if self.v2:
                    events = dict(line.split() for line in
                                  (group / "memory.events").read_text().splitlines())
                    counts.append(int(events.get("max", 0)))
                else:
                    counts.append(int((group / "memory.failcnt").read_text()))
            except (OSError, ValueError):
                counts.append(0)
        return counts

    def remove(self) -> None:
        for rank in range(len(self.limits)):
            _rmdir(self.root / f"rank{rank}")
        _rmdir(self.root)


def join_memory(root: Path, rank: int) -> None:
    (root / f"rank{rank}" / "cgroup.procs").write_text(str(os.getpid()))


def _rmdir(path: Path) -> None:
    if not path.exists():
        return
    for _ in range(50):  # a rank's pages may still be uncharging
        try:
            path.rmdir()
            return
        except OSError:
            subprocess.run(["sleep", "0.1"])


def parse_mem(text: str | None, nodes: int) -> list[int] | None:
    if not text:
        return None
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise NodeError(f"--mem {text!r}: give MB per node, e.g. 600 or 600,500,500") from None
    if len(values) == 1:
        values *= nodes
    if len(values) != nodes or any(v < 0 for v in values):
        raise NodeError(f"--mem has {len(values)} values for {nodes} nodes (MB, 0 = no limit)")
    return values


def drop_caches() -> None:
    """A cold page cache, as on machines that just booted."""
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def add_arguments(parser) -> None:
    """cluster.py's options for disks and memory."""
    parser.add_argument("--disks", default="shared", choices=["shared", "private"],
                        help="private: every node but node 0 has a disk of its own (its own "
                             "pipeinfer cache under --disk-root, and no view of the user's "
                             "cache, of the files the command names after -m/-md, or of "
                             "--hide): only node 0 holds the models")
    parser.add_argument("--disk-root", help="where the nodes' private disks live (kept, so a "
                        "later job finds them as left; default a temporary directory)")
    parser.add_argument("--hide", action="append", help="a file or directory the nodes with "
                        "private disks must not see (repeatable)")
    parser.add_argument("--mem", help="memory per node in MB (one value, or one per node; 0 = "
                        "no limit, only measured): a memory cgroup per rank; the peak per "
                        "node is printed at the end")
    parser.add_argument("--drop-caches", action="store_true", help="empty the page cache "
                        "before the job (cold start, as on machines that just booted)")


def setup(args, job: str, cleanup) -> list[str]:
    """cluster.py's launcher: the memory cgroups and private disks its arguments ask for
    (removed by `cleanup`, an ExitStack); the rank shim's arguments for them."""
    shim = []
    limits = parse_mem(args.mem, args.nodes)
    if limits is not None:
        memory = MemoryLimits(job, limits)
        cleanup.callback(memory.remove)
        cleanup.callback(_report_memory, memory)
        memory.create()
        shim += ["--memcg", str(memory.root)]
    if args.drop_caches:
        drop_caches()
    if args.disks == "private":
        root = Path(args.disk_root) if args.disk_root else Path(tempfile.mkdtemp(
            prefix=f"pipeinfer-disks-{job}-"))
        if not args.disk_root:
            cleanup.callback(shutil.rmtree, root, True)
        hidden = [str(user_cache())] + (args.hide or [])
        if any(root.resolve().is_relative_to(Path(h).resolve()) for h in hidden):
            raise NodeError(f"--disk-root {root} lies in a directory the nodes must not "
                               "see (the pipeinfer cache or --hide): choose another")
        shim += ["--disk-root", str(root), "--launcher", str(os.getpid())]
        for path in (args.hide or []) + model_files(args.command):
            shim += ["--hide", os.path.abspath(path)]
    return shim


def _report_memory(memory: "MemoryLimits") -> None:
    peaks = ", ".join("?" if p is None else f"{p:.0f}" for p in memory.peaks_mb())
    limits = ", ".join(str(m) if m else "-" for m in memory.limits)
    print(f"cluster: peak memory per node (MB): {peaks}; limits {limits}; "
          f"times at the limit {memory.failcounts()}", file=sys.stderr)
