#!/usr/bin/env python3
"""Emulate a cluster on one machine: every MPI rank a node of its own, with its own CPU quota
and, optionally, shaped links, a private disk and a memory limit (experiments.harness.cluster).

    python experiments/cluster.py --nodes 4 --cpu 0.5 --link gigabit -- \\
        pipeinfer run -m qwen-coder-1.5b -md qwen-coder-0.5b -p "..." --strategy pipeinfer
"""

import sys
from pathlib import Path

if not __package__:   # run as a script: the repository on the path, as with `python -m`
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from experiments.harness.cluster import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
