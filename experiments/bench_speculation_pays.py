#!/usr/bin/env python3
"""Does speculation pay with default flags? The goals of "speculation that always pays", in one
script run on the emulated cluster (experiments/cluster.py: 4 nodes x 0.5 core by default, the
head without target layers), every scenario against plain iterative decoding of the same
prompt, repeats interleaved so the ratios compare like with like on a noisy machine.

Scenarios (pick with --scenarios):
  edit       a code-editing prompt (rewrite a given function with a small change), n-gram
             drafts only (no draft model)
  unrelated  a free-writing prompt with an unrelated draft (the 0.5B draft cut to its first
             8 layers), the guard on (default) and off (--guard-accept 0)
  matched    the coding prompt with the matched 0.5B draft: the defaults, the draft model
             alone without the guard (what pipeinfer did before), the compact draft
  sources    the coding prompt with the matched draft: which draft source, guard on or off
  exactness  what exactness costs: the plain layout (exact up to 7 tokens a run), and
             --no-exact (repacked, runs up to --draft: not exact)

    python experiments/bench_speculation_pays.py -k 3 -n 160 [--scenarios edit,unrelated]

Prints one line per run, then per scenario the median t/s, acceptance and the ratio to its
iterative run, and whether every exact variant's output equals its iterative output.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from cluster_run import run_cluster  # beside this script  # noqa: E402

EDIT_PROMPT = '''Here is a Python function:

def summarize(transactions):
    """Total amount per category, largest first."""
    totals = {}
    for date, amount, category in transactions:
        if category not in totals:
            totals[category] = 0.0
        totals[category] += amount
    result = sorted(totals.items(), key=lambda item: item[1], reverse=True)
    return [(category, round(total, 2)) for category, total in result]

Rewrite it so that it ignores transactions with a negative amount. Reply with the whole
function only.'''
CODE_PROMPT = ("Write a Python function that parses a CSV file of transactions (date, amount, "
               "category) and returns the total amount per category, sorted by amount.")
STORY_PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."

UNRELATED = "unrelated"   # stands for the cut draft's path in the variants
SCENARIOS = {
    "edit": (EDIT_PROMPT, {
        "iterative": ["--strategy", "iterative"],
        "pipeinfer ngram": ["--strategy", "pipeinfer", "--draft-source", "ngram"],
        "speculative ngram": ["--strategy", "speculative", "--draft-source", "ngram"]}),
    "unrelated": (STORY_PROMPT, {
        "iterative": ["--strategy", "iterative"],
        "pipeinfer unrelated": ["--strategy", "pipeinfer", "-md", UNRELATED],
        "pipeinfer unrelated, no guard": ["--strategy", "pipeinfer", "-md", UNRELATED,
                                          "--guard-accept", "0"]}),
    "matched": (CODE_PROMPT, {
        "iterative": ["--strategy", "iterative"],
        "pipeinfer": ["--strategy", "pipeinfer", "-md", "DRAFT"],
        "pipeinfer model, no guard": ["--strategy", "pipeinfer", "-md", "DRAFT",
                                      "--draft-source", "model", "--guard-accept", "0"],
        "pipeinfer, compact draft": ["--strategy", "pipeinfer", "-md", "qwen-coder-0.5b-q4_0"]}),
    "sources": (CODE_PROMPT, {
        "iterative": ["--strategy", "iterative"],
        "pipeinfer model": ["--strategy", "pipeinfer", "-md", "DRAFT", "--draft-source", "model"],
        "pipeinfer model, no guard": ["--strategy", "pipeinfer", "-md", "DRAFT",
                                      "--draft-source", "model", "--guard-accept", "0"],
        "pipeinfer both": ["--strategy", "pipeinfer", "-md", "DRAFT", "--draft-source", "both"],
        "pipeinfer both, ngram-min 4": ["--strategy", "pipeinfer", "-md", "DRAFT",
                                        "--draft-source", "both", "--ngram-min", "4"]}),
    "exactness": (CODE_PROMPT, {
        "iterative": ["--strategy", "iterative"],
        "iterative --no-repack": ["--strategy", "iterative", "--no-repack"],
        "pipeinfer": ["--strategy", "pipeinfer", "-md", "DRAFT"],
        "pipeinfer --no-repack": ["--strategy", "pipeinfer", "-md", "DRAFT", "--no-repack"],
        "pipeinfer --no-exact": ["--strategy", "pipeinfer", "-md", "DRAFT", "--no-exact"]}),
}


def unrelated_draft(draft: str, n_layers: int = 8) -> Path:
    """The draft cut to its first `n_layers` layers (a final stage file: it keeps the output
    head and vocabulary): same tokenizer, poor guesses."""
    from pipeinfer.model.models import cache_dir, resolve_model
    from pipeinfer.model.partition import StageRange
    from pipeinfer.model.slicing import model_info, read_model, write_stage

    src = resolve_model(draft)
    out = cache_dir() / "bench" / f"{src.stem}-first{n_layers}.gguf"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        header = read_model(src)
        tmp = out.with_suffix(".tmp")
        write_stage(header, model_info(header, src), StageRange(0, 0, n_layers, True), tmp,
                    keep_tokenizer=True)
        tmp.rename(out)
    return out


def run_once(prompt: str, flags: list[str], args) -> dict:
    cmd = [str(ROOT / ".venv" / "bin" / "pipeinfer"), "run", "-m", args.model, "-p", prompt,
           "--chat", "-n", str(args.n), "--ignore-eos", "--layer-split", args.split, "-t", "1",
           "--json", *flags]
    launch = [sys.executable, str(HERE / "cluster.py"), "--nodes", str(args.nodes),
              "--cpu", str(args.cpu), "--"] + cmd
    code, stdout, stderr = run_cluster(launch, args.timeout)
    if code is None:
        return {"error": f"hung: stopped after {args.timeout:.0f} s"}
    if code != 0:
        return {"error": (stderr.strip().splitlines() or ["(no output)"])[-1]}
    return json.loads(stdout.strip().splitlines()[-1])


def median(rs: list[dict], key: str):
    vals = [r[key] for r in rs if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def report(name: str, runs: dict[str, list[dict]]) -> None:
    print(f"\n{name}:")
    print(f"  {'variant':32} {'t/s':>6} {'/iter':>6} {'accept':>7} {'exact':>6}  runs (t/s)")
    base = runs["iterative"]
    it = median(base, "speed_tps")
    for variant, rs in runs.items():
        ok = [r for r in rs if "error" not in r]
        if not ok:
            print(f"  {variant:32} failed: {rs[0]['error']}")
            continue
        tps, acc = median(ok, "speed_tps"), median(ok, "accept_rate")
        exact = all(r["tokens"] == base[0].get("tokens") for r in ok)
        print(f"  {variant:32} {tps:6.2f} {tps / it:6.2f} "
              f"{'-' if acc is None else f'{acc:.2f}':>7} {str(exact):>6}  "
              + " ".join(f"{r['speed_tps']:.2f}" for r in ok))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen-coder-1.5b")
    parser.add_argument("--draft", default="qwen-coder-0.5b")
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--cpu", type=float, default=0.5)
    parser.add_argument("--split", default="0,0.34,0.33,0.33")
    parser.add_argument("-n", type=int, default=160)
    parser.add_argument("-k", type=int, default=3, help="repeats (interleaved)")
    parser.add_argument("--scenarios", default="edit,unrelated,matched,exactness",
                        help="comma-separated, of: " + ", ".join(SCENARIOS))
    parser.add_argument("--timeout", type=float, default=900)
    args = parser.parse_args()
    names = args.scenarios.split(",")
    swap = {UNRELATED: str(unrelated_draft(args.draft)), "DRAFT": args.draft}
    runs = {s: {v: [] for v in SCENARIOS[s][1]} for s in names}
    for rep in range(args.k):
        for s in names:
            prompt, variants = SCENARIOS[s]
            for variant, flags in variants.items():
                t0 = time.time()
                r = run_once(prompt, [swap.get(f, f) for f in flags], args)
                runs[s][variant].append(r)
                print(f"# rep {rep} {s} / {variant}: "
                      + (r["error"] if "error" in r else
                         f"{r['speed_tps']:.2f} t/s, accept {r.get('accept_rate')}")
                      + f" ({time.time() - t0:.0f} s)", flush=True)
    for s in names:
        report(s, runs[s])


if __name__ == "__main__":
    main()
