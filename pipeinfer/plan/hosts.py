"""The nodes of a hostfile, for `plan` and `simulate` without a profile: one node per slot, in
the order mpiexec would place ranks (rank 0, the head, on the first).

    node1            # one slot
    node2:2          # MPICH/Hydra: two slots
    node3 slots=2    # Open MPI
"""

from __future__ import annotations

import re
from pathlib import Path

from .cost import CostError

_HYDRA = re.compile(r"^(?P<host>[^\s:#]+)(?::(?P<n>\S+))?$")
_OPENMPI = re.compile(r"^(?P<host>[^\s:#]+)\s+slots\s*=\s*(?P<n>\S+)$")


def read_hostfile(path: str | Path) -> list[str]:
    """One host name per slot; CostError naming the file and line for what is not a host."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as err:
        raise CostError(f"hostfile {path}: {err.strerror or err}") from None
    hosts: list[str] = []
    for number, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = _HYDRA.match(line) or _OPENMPI.match(line)
        n = match and (match.group("n") or "1")
        if not match or not n.isdigit() or int(n) < 1:
            raise CostError(f"hostfile {path}, line {number}: {raw.strip()!r} is not "
                            "'host', 'host:N' or 'host slots=N' (N >= 1)")
        hosts += [match.group("host")] * int(n)
    if not hosts:
        raise CostError(f"hostfile {path} names no host")
    return hosts


def parse_memory(text: str, n_nodes: int) -> list[float]:
    """--memory: MB free per node, one value for all or one per node."""
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        raise CostError(f"--memory {text!r}: give MB per node, e.g. 4000 or 8000,4000") from None
    if len(values) == 1:
        values *= n_nodes
    if len(values) != n_nodes or any(v <= 0 for v in values):
        raise CostError(f"--memory {text!r}: one positive value, or one per node ({n_nodes})")
    return values
