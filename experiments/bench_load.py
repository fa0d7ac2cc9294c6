#!/usr/bin/env python3
"""Time from launch to the first token when only node 0 holds the model files, on the
emulated cluster with separate disks and shaped links, pipeinfer against llama.cpp's RPC backend
in one run:

    python experiments/bench_load.py --nodes 4 --cpu 0.5 --link gigabit -k 3

Per repeat, in this order (each system's second start right after its first):
- pipeinfer first start: every worker's disk empty (cluster.py --disks private), rank 0 sends
  each its slice (rank 0's own cache already holds the cut slices, as after any earlier run:
  an untimed warm-up start makes sure);
  its log gives the transfer phase (first byte to the last verified slice);
- pipeinfer second start: the same disks, nothing travels;
- pipeinfer first start again, rank 0 serving one rank at a time, the largest file first
  (PIPEINFER_WEIGHTS_AT_ONCE=1) instead of all at once (its default);
- llama.cpp RPC without -c: rpc-servers on nodes 1..N-1, llama-completion on node 0 sends every
  tensor at each start;
- llama.cpp RPC with -c, first start (empty tensor caches) and second start (cached).
Launch to first token: from starting the job (pipeinfer's mpiexec; llama-completion, the
rpc-servers already listening) to the first byte of generated text on its stdout. Peak RSS per
node comes with every row. Prints a table of medians and their ratios.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

if not __package__:   # run as `python experiments/NAME.py`: the repository on the path
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from experiments.bench_peers import CODE_PROMPT, render_prompt  # noqa: E402
from experiments.harness import CLUSTER, ROOT, build_peers  # noqa: E402
from experiments.harness.bench_runs import RunSpec, _links, peer_command  # noqa: E402
from experiments.harness.cluster import LINK_PRESETS  # noqa: E402
from experiments.harness.cluster_run import stop  # noqa: E402
from experiments.harness.cpu_quota import CpuQuotas, host_cpu  # noqa: E402
from experiments.harness.peers import PeerCluster, last_line, peak_rss_mb  # noqa: E402

SENT = re.compile(r"sent ([\d.]+) MB of weights in ([\d.]+) s")
LINK_MB_S = {"gigabit": 125.0, "slow": 12.5}


def first_byte(proc: subprocess.Popen, timeout: float, watch=None) -> float | None:
    """Seconds until `proc` writes its first byte to stdout (None if it ended first)."""
    t0 = time.monotonic()
    while True:
        byte = proc.stdout.read(1)
        if byte:
            return time.monotonic() - t0
        if proc.poll() is not None or time.monotonic() - t0 > timeout:
            return None


def pipeinfer_start(args, disks: Path, prompt: str, env: dict | None = None) -> dict:
    cmd = [sys.executable, str(CLUSTER), "--nodes", str(args.nodes), "--cpu",
           f"{args.cpu:g}", "--link", args.link, "--disks",
           "private", "--disk-root", str(disks), "--", str(Path(sys.executable).parent /
                                                        "pipeinfer"),
           "run", "-m", args.model, "-p", prompt, "-n", str(args.n), "--ignore-eos", "-t", "1",
           "--strategy", "iterative",
           "--layer-split", ",".join(["0"] + [f"{1 / (args.nodes - 1)!r}"] * (args.nodes - 1))]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
                            env={**os.environ, **(env or {})})
    try:
        ttft = first_byte(proc, args.timeout)
        _, err = proc.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        stop(proc)
        return {"error": f"hung: stopped after {args.timeout:.0f} s"}
    except BaseException:  # Ctrl-C: cluster.py takes its ranks, cgroups and links down
        stop(proc)
        raise
    err = err.decode(errors="replace")
    if proc.returncode != 0 or ttft is None:
        return {"error": f"exit {proc.returncode}: {last_line(err)}"}
    sent = SENT.search(err)
    return {"launch_to_token_s": ttft, "wall_s": time.monotonic() - t0,
            "transfer_s": float(sent.group(2)) if sent else 0.0,
            "sent_mb": float(sent.group(1)) if sent else 0}


def rpc_start(args, bin_dir: Path, prompt: str, cache: list[Path] | None) -> dict:
    spec = RunSpec("llama-rpc", "llama-rpc", args.nodes, args.cpu, args.model, "", prompt,
                   args.n, link=args.link)
    quotas = CpuQuotas(uuid.uuid4().hex[:6], [args.cpu] * args.nodes)
    quotas.create()
    links = None
    try:
        links = _links(quotas.job, spec) if args.link != "none" else None
        with PeerCluster(bin_dir, quotas, links, rpc_cache=cache) as cluster:
            proc = cluster.start_main(peer_command(spec, bin_dir, cluster.endpoints()),
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            ttft = first_byte(proc, args.timeout)
            rss = [peak_rss_mb(s.pid) or 0.0 for s in cluster.servers]
            _, err = proc.communicate(timeout=args.timeout)
            if proc.returncode != 0 or ttft is None:
                return {"error": f"exit {proc.returncode}: "
                                 f"{last_line(err.decode(errors='replace'))}"}
            rss = [max(a, peak_rss_mb(s.pid) or 0.0) for a, s in zip(rss, cluster.servers)]
            return {"launch_to_token_s": ttft, "rpc_rss_mb": [round(r) for r in rss]}
    finally:
        if links is not None:
            links.remove()
        quotas.remove()


def one_repeat(args, bin_dir: Path | None, prompt: str, scratch: Path) -> dict[str, dict]:
    rows = {}
    disks = scratch / f"disks-{uuid.uuid4().hex[:6]}"
    rows["pipeinfer first"] = pipeinfer_start(args, disks, prompt)
    rows["pipeinfer second"] = pipeinfer_start(args, disks, prompt)
    shutil.rmtree(disks, ignore_errors=True)
    rows["pipeinfer first, 1 by 1"] = pipeinfer_start(args, disks, prompt,
                                                      {"PIPEINFER_WEIGHTS_AT_ONCE": "1"})
    shutil.rmtree(disks, ignore_errors=True)
    if bin_dir is not None:
        rows["llama-rpc"] = rpc_start(args, bin_dir, prompt, None)
        cache = [scratch / f"rpc-cache-{uuid.uuid4().hex[:6]}-{n}" for n in range(1, args.nodes)]
        rows["llama-rpc -c first"] = rpc_start(args, bin_dir, prompt, cache)
        rows["llama-rpc -c second"] = rpc_start(args, bin_dir, prompt, cache)
        for path in cache:
            shutil.rmtree(path, ignore_errors=True)
    return rows


def report(args, reps: list[dict[str, dict]], slice_mb: float) -> None:
    print(f"# host: {host_cpu()}; {args.nodes} nodes x {args.cpu:g} core, link {args.link}, "
          f"{args.model}, K={len(reps)}")
    print(f"{'system':22} {'launch->token s (median, min-max)':36} transfer s")
    medians = {}
    for name in reps[0]:
        times = [r[name]["launch_to_token_s"] for r in reps if "error" not in r[name]]
        errors = [r[name]["error"] for r in reps if "error" in r[name]]
        if not times:
            print(f"{name:22} error: {errors[0]}")
            continue
        medians[name] = statistics.median(times)
        transfer = [r[name].get("transfer_s") for r in reps if r[name].get("transfer_s")]
        print(f"{name:22} {medians[name]:7.2f} ({min(times):.2f}-{max(times):.2f})"
              f"{'':18} {statistics.median(transfer) if transfer else '':}")
    rate = LINK_MB_S.get(args.link)
    transfers = [r["pipeinfer first"].get("transfer_s") for r in reps
                 if r["pipeinfer first"].get("transfer_s")]
    if rate and transfers:
        ideal = slice_mb / rate
        print(f"transfer phase: median {statistics.median(transfers):.2f} s for {slice_mb:.0f} "
              f"MB; the link's rate alone: {ideal:.2f} s; ratio "
              f"{statistics.median(transfers) / ideal:.2f} (goal <= 1.3)")
    if "pipeinfer second" in medians and "llama-rpc -c second" in medians:
        print(f"second start: pipeinfer / llama-rpc -c = "
              f"{medians['pipeinfer second'] / medians['llama-rpc -c second']:.2f} (goal <= 1)")
    for rep in reps:
        for name, row in rep.items():
            if "rpc_rss_mb" in row:
                print(f"# {name}: rpc-server peak RSS per worker node {row['rpc_rss_mb']} MB")
                break


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--cpu", type=float, default=0.5)
    parser.add_argument("--link", default="gigabit", choices=["none", *LINK_PRESETS])
    parser.add_argument("-m", "--model", default="qwen-coder-1.5b")
    parser.add_argument("-n", type=int, default=8, help="tokens to generate per start")
    parser.add_argument("-k", type=int, default=3, help="repeats")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--no-peers", action="store_true", help="pipeinfer only")
    args = parser.parse_args()
    prompt = render_prompt(args.model, CODE_PROMPT)
    bin_dir = None
    if not args.no_peers:
        try:
            bin_dir = build_peers.build(2) / "bin"
        except build_peers.BuildError as err:
            print(f"bench_load: no llama.cpp peers ({err}): pipeinfer only", file=sys.stderr)
    scratch = Path(tempfile.mkdtemp(prefix="bench-load-"))
    try:
        # rank 0's own cache gets the slices cut (and hashed) once, before anything is timed
        pipeinfer_start(args, scratch / "warm-up", prompt)
        reps = []
        for k in range(args.k):
            reps.append(one_repeat(args, bin_dir, prompt, scratch))
            print(f"# repeat {k + 1}: " + "; ".join(
                f"{n} {r.get('launch_to_token_s', r.get('error'))}" for n, r in reps[-1].items()),
                file=sys.stderr, flush=True)
        sent = [r["pipeinfer first"].get("sent_mb", 0) for r in reps]
        report(args, reps, max(sent))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
