#!/usr/bin/env python3
"""What memory a node really needs: the same pipeinfer job without memory limits and
under per-node limits (experiments/cluster.py --mem, a memory cgroup per rank), each start with
a cold page cache, repeats interleaved, in one run:

    python experiments/bench_memory.py --limits 610,490,450,630 -k 3
    python experiments/bench_memory.py --limits 610,490,450,630 -k 3 --mmap   # as before

Defaults: Qwen2.5-Coder 1.5B with the 0.5B draft, pipeinfer, 4 ranks without CPU quotas (each
may use both cores), split 0,0.34,0.33,0.33, 48 tokens. Prints per setting the speed (median,
min-max), the ratio limited / unlimited, and per node the peak charge of its memory cgroup
(page cache included), the peak RSS pipeinfer reports, the times it hit its limit, and the
slice bytes it loaded. --mmap runs both settings again with PIPEINFER_MMAP=1 (weights mapped,
as pipeinfer loaded them before), for the before/after table.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

if not __package__:   # run as `python experiments/NAME.py`: the repository on the path
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from experiments.harness import CLUSTER  # noqa: E402
from experiments.harness.cluster_run import run_cluster  # noqa: E402
from experiments.harness.cpu_quota import host_cpu  # noqa: E402

PROMPT = "Write a Python function that reverses a linked list."
PEAKS = re.compile(r"peak memory per node \(MB\): ([\d., ?]+); limits [^;]+; times at the limit "
                   r"\[([\d, ]*)\]")


def run(args, limits: str, mmap: bool) -> dict:
    cmd = [sys.executable, str(CLUSTER), "--nodes", str(args.nodes), "--cpu",
           str(args.cpu), "--mem", limits, "--drop-caches"]
    if args.disk_root:  # only node 0 has the model files: the others receive their slices
        cmd += ["--disks", "private", "--disk-root", args.disk_root]
    cmd += ["--",
           str(Path(sys.executable).parent / "pipeinfer"), "run", "-m", args.model, "-md",
           args.draft, "--chat", "-p", PROMPT, "-n", str(args.n), "--ignore-eos", "--strategy",
           args.strategy, "--layer-split", args.split, "-c", str(args.ctx), "--json"]
    env = dict(os.environ, **({"PIPEINFER_MMAP": "1"} if mmap else {}))
    code, stdout, stderr = run_cluster(cmd, args.timeout, env=env)
    peaks = PEAKS.search(stderr)
    row = {"peak_mb": [float(p) if p != "?" else None for p in peaks.group(1).split(", ")]
           if peaks else [], "at_limit": [int(c) for c in peaks.group(2).split(",")]
           if peaks and peaks.group(2).strip() else []}
    if code is None:
        return {**row, "error": f"hung: stopped after {args.timeout:.0f} s"}
    if code != 0:
        lines = stderr.strip().splitlines() or ["?"]
        errors = [line for line in lines if "error" in line.lower()]
        return {**row, "error": (errors or lines)[0]}
    result = json.loads(stdout.strip().splitlines()[-1])
    return {**row, "speed": result["speed_tps"], "tokens": result["tokens"],
            "prompt_tokens": result["prompt_tokens"],
            "rss": [s.get("peak_rss_mb") for s in result["rank_stats"]]}


def oracle(model: str, prompt: list[int], n: int) -> list[int]:
    """llama.cpp's greedy tokens on one node (llama-cpp-python, the stages' weight layout)."""
    from llama_cpp import Llama

    from pipeinfer.model.llama_lib import llama_repacking
    from pipeinfer.model.models import resolve_model

    with llama_repacking(True):
        llm = Llama(model_path=str(resolve_model(model)), n_ctx=2048, n_threads=1,
                    flash_attn=True, verbose=False)
    out = []
    for token in llm.generate(prompt, temp=0.0, repeat_penalty=1.0):
        out.append(int(token))
        if len(out) >= n:
            break
    llm.close()
    return out


def table(args, name: str, rows: list[dict], base: float | None) -> float | None:
    ok = [r for r in rows if "error" not in r]
    if not ok:
        print(f"{name:28} failed: {rows[0]['error']}")
        return None
    speeds = [r["speed"] for r in ok]
    med = statistics.median(speeds)
    ratio = f"  {med / base:.2f}x unlimited" if base else ""
    print(f"{name:28} {med:6.2f} t/s ({min(speeds):.2f}-{max(speeds):.2f}){ratio}"
          f"{'' if len(ok) == len(rows) else f'  ({len(rows) - len(ok)} failed)'}")
    for node in range(args.nodes):
        peak = max((r["peak_mb"][node] or 0) for r in ok if r["peak_mb"])
        rss = max((r["rss"][node] or 0) for r in ok)
        hits = max((r["at_limit"][node] for r in ok if r["at_limit"]), default=0)
        print(f"    node {node}: peak charge {peak:5.0f} MB, peak RSS {rss:5.0f} MB, "
              f"at the limit {hits} times")
    return med


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limits", default="610,490,450,630", help="MB per node")
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--cpu", type=float, default=2.0, help="CPU quota per node (2: none)")
    parser.add_argument("-m", "--model", default="qwen-coder-1.5b")
    parser.add_argument("-md", "--draft", default="qwen-coder-0.5b")
    parser.add_argument("--strategy", default="pipeinfer")
    parser.add_argument("--split", default="0,0.34,0.33,0.33")
    parser.add_argument("-n", type=int, default=48)
    parser.add_argument("-c", "--ctx", type=int, default=2048, help="run's -c (the KV cache: "
                        "4x this many cells for the speculative strategies, on every rank)")
    parser.add_argument("-k", type=int, default=3)
    parser.add_argument("--mmap", action="store_true", help="also with PIPEINFER_MMAP=1")
    parser.add_argument("--oracle", action="store_true", help="compare the output with "
                        "llama.cpp's greedy output on one node (llama-cpp-python)")
    parser.add_argument("--private-disks", action="store_true", help="every node but node 0 "
                        "has a disk of its own (cluster.py --disks private), kept across the "
                        "runs: the first start sends the slices, the others find them")
    parser.add_argument("--timeout", type=float, default=900)
    args = parser.parse_args()
    args.disk_root = tempfile.mkdtemp(prefix="bench-memory-") if args.private_disks else None
    try:
        return measure(args)
    finally:
        if args.disk_root:
            shutil.rmtree(args.disk_root, ignore_errors=True)


def measure(args) -> int:
    settings = [("unlimited", "0", False), (f"limits {args.limits}", args.limits, False)]
    if args.mmap:
        settings += [("mmap unlimited", "0", True), (f"mmap limits {args.limits}",
                                                     args.limits, True)]
    rows: dict[str, list[dict]] = {name: [] for name, _, _ in settings}
    for k in range(args.k):
        for name, limits, mmap in settings:
            rows[name].append(run(args, limits, mmap))
            r = rows[name][-1]
            print(f"# rep {k + 1} {name}: {r.get('speed', r.get('error'))} t/s, peaks "
                  f"{r['peak_mb']}", file=sys.stderr, flush=True)
    print(f"# host: {host_cpu()}; {args.nodes} ranks x {args.cpu:g} core, {args.model} + "
          f"{args.draft}, {args.strategy}, split {args.split}, {args.n} tokens, -c {args.ctx}, "
          f"K={args.k}, cold page cache each start"
          + (", only node 0 holding the model files" if args.disk_root else ""))
    tokens = {tuple(r["tokens"]) for rs in rows.values() for r in rs if "tokens" in r}
    print(f"# outputs: {len(tokens)} distinct token sequence(s) over every run")
    done = [r for rs in rows.values() for r in rs if "tokens" in r]
    if args.oracle and done:
        same = list(tokens) == [tuple(oracle(args.model, done[0]["prompt_tokens"], args.n))]
        print(f"# equal to llama.cpp's greedy output (llama-cpp-python, one node): {same}")
    base = None
    for name, _, mmap in settings:
        if name.endswith("unlimited"):
            base = table(args, name, rows[name], None)
        else:
            table(args, name, rows[name], base)
    return 0


if __name__ == "__main__":
    sys.exit(main())
