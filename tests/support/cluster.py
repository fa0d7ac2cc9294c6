"""Whether this machine can run the emulated cluster (experiments/cluster.py, CLUSTER): it
needs root, a writable cgroup cpu controller and network namespaces. The tests that launch
it are marked needs_cgroups or needs_netns and skip, saying why, where the machine forbids
what they need."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from experiments.harness import CLUSTER  # noqa: F401 (the tests' name for it)
from experiments.harness.cluster import FRONT_ADDRESS  # noqa: F401 (where nodes reach us)
from experiments.harness.cpu_quota import QuotaError, controller


def why_no_cgroups() -> str | None:
    if os.geteuid() != 0:
        return "the cluster emulation needs root (cgroups, network namespaces)"
    try:
        root, _ = controller()
    except QuotaError as err:
        return str(err)
    probe = root / f"pitest-probe-{os.getpid()}"
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError as err:
        return f"cgroup fs {root} is not writable: {err}"
    return None


def why_no_netns() -> str | None:
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "iproute2 (ip, tc) is not installed"
    name = f"ptprobe{os.getpid()}"
    result = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if result.returncode != 0:
        return f"cannot create network namespaces: {result.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


NO_CGROUPS = why_no_cgroups()
NO_NETNS = NO_CGROUPS or why_no_netns()
needs_cgroups = pytest.mark.skipif(NO_CGROUPS is not None, reason=str(NO_CGROUPS))
needs_netns = pytest.mark.skipif(NO_NETNS is not None, reason=str(NO_NETNS))
