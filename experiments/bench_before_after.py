#!/usr/bin/env python3
"""Speed of this tree against an earlier commit, in one script run, on the emulated cluster.

Every repeat runs every variant of both commits, interleaved, on the same emulated cluster
(experiments/cluster.py; default 4 nodes x 0.5 core, the head without target layers), so the
ratios compare like with like on a noisy shared machine. Both commits are checked out into
git worktrees (so edits in progress in this checkout do not leak in) and run from there with
this venv (the native module copied in); each run checks which tree it imported.

    python experiments/bench_before_after.py --baseline HEAD~3 [--candidate HEAD] -k 3 -n 128

Prints one line per run and, at the end, per tree: median t/s, TTFT, ITL and acceptance of
every variant, its ratio to iterative, and whether all outputs were identical. Variants named
"edit ..." run bench_speculation_pays's code-editing prompt without a draft model (n-gram
drafts), against "edit iterative":

    python experiments/bench_before_after.py --baseline main -k 3 -n 160 \
        --variants "edit iterative,edit pipeinfer ngram"
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench_speculation_pays import EDIT_PROMPT  # beside this script
from cluster_run import failure, run_cluster

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PROMPT = ("Write a Python function that parses a CSV file of transactions (date, amount, "
          "category) and returns the total amount per category, sorted by amount.")
VARIANTS = {"iterative": ["--strategy", "iterative"],
            "pipeinfer": ["--strategy", "pipeinfer"],
            "pipeinfer model": ["--strategy", "pipeinfer", "--draft-source", "model"],
            "pipeinfer -pr0 -pd0": ["--strategy", "pipeinfer", "-pr", "0", "-pd", "0"],
            # the last stage also computes the output matrix (about five layers' worth of
            # Qwen2.5-Coder 1.5B): a split that gives it fewer layers balances the stages
            "pipeinfer split 0/.4/.4/.2": ["--strategy", "pipeinfer",
                                           "--layer-split", "0,0.4,0.4,0.2"],
            # the code-editing prompt of bench_speculation_pays, drafts from the text only
            "edit iterative": ["--strategy", "iterative"],
            "edit pipeinfer ngram": ["--strategy", "pipeinfer", "--draft-source", "ngram"],
            "edit speculative ngram": ["--strategy", "speculative", "--draft-source", "ngram"]}
EDIT = "edit "   # variants named so run the edit prompt without a draft model
LAUNCH = "import sys; sys.argv[0] = 'pipeinfer'; from pipeinfer.cli import main; main()"


def worktree(rev: str) -> Path:
    """A worktree of `rev` that runs with this venv."""
    sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", rev], check=True,
                         capture_output=True, text=True).stdout.strip()
    tree = Path(f"/tmp/pipeinfer-tree-{sha}")
    if not tree.exists():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), sha],
                       check=True, capture_output=True)
    for native in (ROOT / "pipeinfer").glob("_native*.so"):
        target = tree / "pipeinfer" / native.name
        if not target.exists():
            shutil.copy(native, target)
    return tree


def run_once(tree: Path, variant: str, args) -> dict:
    edit = variant.startswith(EDIT)
    model = ["-m", args.model] + ([] if edit else ["-md", args.draft])
    cmd = [sys.executable, "-c", LAUNCH, "run", *model,
           "-p", EDIT_PROMPT if edit else PROMPT, "--chat", "-n", str(args.n), "--ignore-eos", "--layer-split",
           args.split, "-t", "1", "--json", *VARIANTS[variant]]
    launch = [sys.executable, str(HERE / "cluster.py"), "--nodes", str(args.nodes),
              "--cpu", str(args.cpu), "--"] + cmd
    code, stdout, stderr = run_cluster(launch, args.timeout, env=_env(tree), cwd=tree)
    if code != 0:
        how = failure(code, args.timeout)
        raise SystemExit(f"{tree} {variant} {how}:\n{stderr[-2000:]}")
    return json.loads(stdout.strip().splitlines()[-1])


def _env(tree: Path) -> dict:
    return dict(os.environ, PYTHONPATH=str(tree))


def check_imports(tree: Path) -> None:
    """`python -c` puts its working directory first on sys.path, and the editable install of
    this checkout is on it too: make sure a run in `tree` imports `tree`'s package."""
    out = subprocess.run([sys.executable, "-c", "import pipeinfer; print(pipeinfer.__file__)"],
                         capture_output=True, text=True, env=_env(tree), cwd=tree, check=True)
    if not out.stdout.strip().startswith(str(tree)):
        raise SystemExit(f"a run in {tree} would import {out.stdout.strip()}")


def report(label: str, runs: dict[str, list[dict]]) -> None:
    def med(rs, key):
        vals = [r[key] for r in rs if r.get(key) is not None]
        return statistics.median(vals) if vals else None

    print(f"\n{label}:")
    print(f"  {'variant':22} {'t/s':>7} {'TTFT ms':>8} {'ITL ms':>7} {'accept':>7}  runs (t/s)")
    for variant, rs in runs.items():
        acc = med(rs, "accept_rate")
        print(f"  {variant:22} {med(rs, 'speed_tps'):7.2f} {med(rs, 'ttft_s') * 1000:8.0f} "
              f"{med(rs, 'itl_s') * 1000:7.0f} {acc if acc is None else round(acc, 2)!s:>7}  "
              + " ".join(f"{r['speed_tps']:.2f}" for r in rs))
    for variant in runs:
        base = EDIT + "iterative" if variant.startswith(EDIT) else "iterative"
        if base in runs and variant != base:
            ratio = med(runs[variant], "speed_tps") / med(runs[base], "speed_tps")
            print(f"  {variant} / {base} = {ratio:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", required=True, help="git revision to compare with")
    parser.add_argument("--candidate", default="HEAD", help="git revision to measure")
    parser.add_argument("--model", default="qwen-coder-1.5b")
    parser.add_argument("--draft", default="qwen-coder-0.5b")
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--cpu", type=float, default=0.5)
    parser.add_argument("--split", default="0,0.34,0.33,0.33")
    parser.add_argument("-n", type=int, default=128)
    parser.add_argument("-k", type=int, default=3, help="repeats (interleaved)")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help="comma-separated subset of: " + ", ".join(VARIANTS))
    parser.add_argument("--timeout", type=float, default=900)
    args = parser.parse_args()
    trees = {f"baseline {args.baseline}": worktree(args.baseline),
             f"candidate {args.candidate}": worktree(args.candidate)}
    for tree in trees.values():
        check_imports(tree)
    variants = args.variants.split(",")
    runs = {t: {v: [] for v in variants} for t in trees}
    for rep in range(args.k):
        for variant in variants:
            for label, tree in trees.items():
                t0 = time.time()
                result = run_once(tree, variant, args)
                runs[label][variant].append(result)
                print(f"# rep {rep} {label} {variant}: {result['speed_tps']:.2f} t/s, "
                      f"accept {result.get('accept_rate')} ({time.time() - t0:.0f} s)",
                      flush=True)
    for label in trees:
        report(label, runs[label])
    for edit in (False, True):
        group = [rs for t in runs.values() for v, rs in t.items() if v.startswith(EDIT) == edit]
        if group:
            first = group[0][0]["tokens"]
            same = all(r["tokens"] == first for rs in group for r in rs)
            print(f"\n{'edit prompt' if edit else 'coding prompt'}: outputs identical across "
                  f"trees, variants and repeats: {same}")


if __name__ == "__main__":
    main()
