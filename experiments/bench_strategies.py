#!/usr/bin/env python3
"""Compare strategies on the Qwen2.5-Coder pair in one script run and print ratios.

Settings (see the speculation issue):
  a) 2 ranks on this box: head with the draft and no target layers, one worker with all target
     layers, 1 thread each; plus llama.cpp's own single-node decode at 2 threads;
  b) an emulated 4-node cluster (experiments/cluster.py): 4 ranks capped at half a core each,
     head with the draft and no target layers, target layers over three workers.
Strategies run interleaved (iterative, speculative, pipeinfer, ...) K times; medians reported.

    python experiments/bench_strategies.py --settings a,b -n 128 -k 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent

from cluster_run import failure, run_cluster  # beside this script  # noqa: E402
PROMPT = ("Write a Python function that parses a CSV file of transactions (date, amount, "
          "category) and returns the total amount per category, sorted by amount.")
# pipespec gets the one draft (a 2-model hierarchy); specpipe: one tree level per pipeline step;
# pipespec-rank: pipespec with the draft model on a rank of its own (same number of ranks: in
# (a) the head holds the whole target, in (b) two workers do)
STRATEGIES = ["iterative", "speculative", "pipeinfer", "pipespec", "pipespec-rank", "specpipe"]
SETTINGS = {
    "a": {"ranks": 2, "split": "0,1", "cluster": None, "draft_rank_split": "1/1"},
    "b": {"ranks": 4, "split": "0,0.34,0.33,0.33", "cluster": ["--cpu", "0.5"],
          "draft_rank_split": "0,0.5,0.5/1"},
}


def run_strategy(setting: dict, strategy: str, args) -> dict:
    split = setting["split"]
    if strategy == "pipespec-rank":
        strategy, split = "pipespec", setting["draft_rank_split"]
    cmd = [str(BIN / "pipeinfer"), "run", "-m", args.model, "-md", args.draft, "-p", PROMPT,
           "--chat", "-n", str(args.n), "--ignore-eos", "--strategy", strategy,
           "--layer-split", split, "-t", "1", "--json"] + args.extra
    if setting["cluster"] is None:
        launch = [str(BIN / "mpiexec"), "-n", str(setting["ranks"])] + cmd
    else:
        launch = [sys.executable, str(HERE / "cluster.py"), "--nodes", str(setting["ranks"]),
                  *setting["cluster"], "--"] + cmd
    code, stdout, stderr = run_cluster(launch, args.timeout)
    if code != 0:
        how = failure(code, args.timeout)
        raise SystemExit(f"{strategy} {how}:\n{stderr[-2000:]}")
    return json.loads(stdout.strip().splitlines()[-1])


def llama_cpp_decode(args, threads: int) -> float:
    """llama-cpp-python alone: greedy decode speed (tokens after the first / time)."""
    code = f"""
import time, llama_cpp
from pipeinfer.model.models import resolve_model
llm = llama_cpp.Llama(str(resolve_model({args.model!r})), n_ctx=2048, n_threads={threads},
                      n_threads_batch={threads}, verbose=False)
toks = llm.tokenize({PROMPT!r}.encode())
n, t0 = 0, None
for tok in llm.generate(toks, temp=0.0):
    if t0 is None: t0 = time.perf_counter()
    n += 1
    if n == {args.n}: break
print((n - 1) / (time.perf_counter() - t0))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=args.timeout)
    if out.returncode != 0:
        raise SystemExit(f"llama-cpp-python failed:\n{out.stderr[-2000:]}")
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen-coder-1.5b")
    parser.add_argument("--draft", default="qwen-coder-0.5b")
    parser.add_argument("--settings", default="a,b")
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("-n", type=int, default=128)
    parser.add_argument("-k", type=int, default=2, help="repetitions (interleaved)")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("extra", nargs="*", help="extra pipeinfer run flags (after --)")
    args = parser.parse_args()
    strategies = args.strategies.split(",")
    for name in args.settings.split(","):
        setting = SETTINGS[name]
        results: dict[str, list[dict]] = {s: [] for s in strategies}
        base: list[float] = []
        for rep in range(args.k):
            for strategy in strategies:
                t0 = time.time()
                results[strategy].append(run_strategy(setting, strategy, args))
                print(f"# setting {name} rep {rep} {strategy}: "
                      f"{results[strategy][-1]['speed_tps']} t/s ({time.time() - t0:.0f} s)",
                      file=sys.stderr, flush=True)
            if name == "a":
                base.append(llama_cpp_decode(args, threads=2))
        report(name, setting, results, base)


def report(name: str, setting: dict, results: dict[str, list[dict]], base: list[float]) -> None:
    med = {s: {k: statistics.median(r[k] for r in rs if r[k] is not None)
               if any(r[k] is not None for r in rs) else None
               for k in ("speed_tps", "ttft_s", "itl_s", "accept_rate")}
           for s, rs in results.items()}
    first = results[next(iter(results))][0]["tokens"]
    exact = all(r["tokens"] == first for rs in results.values() for r in rs)
    print(f"\nsetting {name}: {setting['ranks']} ranks, split {setting['split']}, "
          f"cluster {setting['cluster'] or 'none'}; outputs identical: {exact}")
    print(f"{'strategy':13} {'t/s':>8} {'TTFT ms':>8} {'ITL ms':>8} {'accept':>7} "
          f"{'x iter':>7} {'x spec':>7} {'TTFT/iter':>9}")
    it, sp = med.get("iterative"), med.get("speculative")
    for s, m in med.items():
        ratio = lambda ref, key: (f"{m[key] / ref[key]:.2f}" if ref and ref[key] and m[key]
                                  else "-")
        acc = f"{m['accept_rate']:.2f}" if m["accept_rate"] is not None else "-"
        print(f"{s:13} {m['speed_tps']:8.2f} {m['ttft_s'] * 1000:8.0f} {m['itl_s'] * 1000:8.0f} "
              f"{acc:>7} {ratio(it, 'speed_tps'):>7} {ratio(sp, 'speed_tps'):>7} "
              f"{ratio(it, 'ttft_s'):>9}")
    if base:
        b = statistics.median(base)
        line = f"llama.cpp single node, 2 threads: {b:.2f} t/s"
        if "pipeinfer" in med:
            line += f"; pipeinfer / llama.cpp = {med['pipeinfer']['speed_tps'] / b:.2f}"
        print(line)


if __name__ == "__main__":
    main()
