"""cluster.py's per-rank shim (`cluster.py _rank ...`): runs as each MPI rank, puts it on its
emulated node (CPU quota, memory limit, private disk, network namespace, host identity),
then execs the command."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from . import cluster_hosts, node_disks
from .cpu_quota import join_quota


def rank_shim(args: argparse.Namespace) -> None:
    """Runs as each MPI rank: join the rank's cgroup (and namespace), then exec the command."""
    rank = int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
    if args.cgroup:
        join_quota(Path(args.cgroup), rank)
    if args.memcg:
        node_disks.join_memory(Path(args.memcg), rank)
    cluster_hosts.record_pid(args.state, args.host_names, rank)
    if args.host_id:  # a machine of its own: its wake-ups from the others come over UDP
        os.environ["PIPEINFER_HOST_ID"] = f"{args.host_id}-node{rank}"
    # the disk is the host's, not the rank's: a job relaunched without a lost host places its
    # ranks on the others, whose disks hold what those hosts kept (node0 has the models)
    host = args.host_names.split(",")[rank] if args.host_names else f"node{rank}"
    if args.disk_root and host != "node0":
        try:
            node_disks.private_disk(host, Path(args.disk_root), args.hide or [])
        except (OSError, node_disks.NodeError) as err:
            # The other ranks would wait for this one in MPI_Init forever: end the job
            print(f"cluster: rank {rank}: cannot give the node its own disk: {err}",
                  file=sys.stderr)
            os.kill(int(args.launcher), signal.SIGTERM)
            sys.exit(1)
    command = args.command
    if args.netns:
        command = ["nsenter", f"--net=/run/netns/{args.netns}r{rank}", "--"] + command
    try:
        os.execvp(command[0], command)
    except OSError as err:
        print(f"cluster: rank {rank}: cannot run {command[0]}: {err.strerror}", file=sys.stderr)
        sys.exit(127)


def _shim_parser() -> argparse.ArgumentParser:
    shim = argparse.ArgumentParser(prog="cluster.py _rank")
    for flag in ("--cgroup", "--netns", "--memcg", "--disk-root", "--launcher", "--host-id",
                 "--state", "--host-names"):
        shim.add_argument(flag)
    shim.add_argument("--hide", action="append")
    shim.add_argument("command", nargs=argparse.REMAINDER)
    return shim



def main(argv: list[str]) -> int:
    args = _shim_parser().parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    rank_shim(args)
    return 1  # exec failed
