"""What the benchmarks are built on, imported as `experiments.harness` (never run directly,
except `python -m experiments.harness.build_peers`).

The emulated cluster, in the order a job meets it: cluster (the launcher: `experiments/cluster.py`
calls its main) -> cpu_quota (a CPU quota per rank) -> node_disks (a disk and a memory limit per
node) -> linkhub (shaped links where the kernel has no netem) -> cluster_shim (each rank joins
its node, then execs the command) -> cluster_hosts (named hosts that can go down, for the
front of `pipeinfer serve --ranks N`); cluster_run runs one cluster job from a benchmark so that
it never outlives it.

llama.cpp's own programs, the systems pipeinfer is compared with: build_peers (built once per
machine, cached) -> peers (rpc-servers on the emulated nodes) -> peer_output (what they print,
read back). bench_runs runs one system once and writes its CSV row; charts draws the figures
of the results pages from those CSVs; proc_stat samples a job's CPU from /proc;
hops reads the cost per hop out of a run's trace; experiment_config reads the paper protocol's
TOML configs; json_task is the structured-output benchmarks' task; soak is the failover
benchmark's 10-minute soak (`bench_failover.py soak`).
"""

from pathlib import Path

EXPERIMENTS = Path(__file__).resolve().parent.parent
ROOT = EXPERIMENTS.parent
CLUSTER = EXPERIMENTS / "cluster.py"   # the emulated cluster's command line
