#!/usr/bin/env python
"""Overhead of pipeinfer's iterative pipeline against plain llama.cpp (not a timed test).

Configurations, each a fresh process, repetitions interleaved (1, 2, 3, 1, 2, 3, ...) so slow
drifts of this noisy 2-core machine hit all of them alike:

  (1) llama-cpp-python's Llama, 1 thread: greedy decode speed (its defaults: flash attention
      off)
  (1f) the same with flash_attn=True: llama.cpp's own default (flash attention "auto", on for
      CPU), which pipeinfer's stages use; the like-for-like kernel baseline
  (2) pipeinfer, 1 rank, 1 thread                       (mpiexec -n 1)
  (3) pipeinfer, 2 ranks, --layer-split 0,1, 1 thread each: the head holds no layers (it
      embeds, samples and sends), the worker evaluates all of them

Speed is measured alike for all: tokens generated after the first (which comes from the
prompt's logits) over the time from the first token to the last. Goal: (2)/(1) >= 0.95.

    .venv/bin/python experiments/bench_iterative.py [-m qwen-coder-1.5b] [-k 2] [-n 128]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from mpi_util import MPIEXEC, PIPEINFER, launch  # noqa: E402

PROMPT = ("Write a Python function `merge_intervals(intervals)` that takes a list of (start, end) "
          "tuples, merges all overlapping intervals and returns them sorted. Include type hints, "
          "a docstring and a few doctest examples.\n\n```python\n")


def _llama_reference(model: str, tokens: list[int], n: int, n_ctx: int, flash: bool) -> dict:
    """Config (1), run in a child process: time llama-cpp-python's greedy generation."""
    from llama_cpp import Llama

    llm = Llama(model_path=model, n_ctx=n_ctx, n_threads=1, n_threads_batch=1, verbose=False,
                flash_attn=flash)
    out, marks = [], []
    t0 = time.perf_counter()
    for token in llm.generate(tokens, temp=0.0, repeat_penalty=1.0):
        marks.append(time.perf_counter())
        out.append(int(token))
        if len(out) >= n:
            break
    gen_s = marks[-1] - marks[0]
    return {"tokens": out, "speed_tps": (len(out) - 1) / gen_s, "prefill_s": marks[0] - t0,
            "n_generated": len(out)}


def run_llama(model: Path, tokens: list[int], n: int, n_ctx: int, timeout: float,
              flash: bool = False) -> dict:
    cmd = [sys.executable, __file__, "--child-llama", str(model), json.dumps(tokens), str(n),
           str(n_ctx), str(int(flash))]
    t0 = time.perf_counter()
    res = launch(cmd, timeout=timeout)
    if res.rc != 0 or res.json is None:
        raise SystemExit(f"llama-cpp-python reference failed:\n{res.describe()}")
    res.json["launch_s"] = time.perf_counter() - t0
    return res.json


def run_pipeinfer(ranks: int, model: str, prompt: str, n: int, n_ctx: int, split: str | None,
                  timeout: float) -> dict:
    cmd = [str(MPIEXEC), "-n", str(ranks), str(PIPEINFER), "run", "-m", model, "-p", prompt,
           "-n", str(n), "-c", str(n_ctx), "-t", "1", "--ignore-eos", "--json"]
    if split:
        cmd += ["--layer-split", split]
    t0 = time.perf_counter()
    res = launch(cmd, timeout=timeout)
    if res.rc != 0 or res.json is None:
        raise SystemExit(f"pipeinfer run failed:\n{res.describe()}")
    res.json["launch_s"] = time.perf_counter() - t0
    return res.json


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child-llama":
        model, tokens, n, n_ctx = sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4]), \
            int(sys.argv[5])
        print(json.dumps(_llama_reference(model, tokens, n, n_ctx, sys.argv[6] == "1")))
        return 0

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default="qwen-coder-1.5b")
    ap.add_argument("-n", "--n-predict", type=int, default=128)
    ap.add_argument("-k", "--reps", type=int, default=2, help="interleaved repetitions")
    ap.add_argument("-c", "--ctx", type=int, default=1024)
    ap.add_argument("-p", "--prompt", default=PROMPT)
    ap.add_argument("--timeout", type=float, default=900)
    args = ap.parse_args()

    from pipeinfer.model.models import resolve_model
    from pipeinfer.model.tokenizer import Tokenizer

    path = resolve_model(args.model, progress=lambda m: print(m, file=sys.stderr))
    prompt_tokens = Tokenizer(path).tokenize(args.prompt)
    print(f"model {path.name}, prompt {len(prompt_tokens)} tokens, {args.n_predict} tokens "
          f"greedy, {args.reps} interleaved repetitions", flush=True)

    configs = [
        ("(1) llama-cpp-python, 1 thread",
         lambda: run_llama(path, prompt_tokens, args.n_predict, args.ctx, args.timeout)),
        ("(1f) llama-cpp-python, flash_attn",
         lambda: run_llama(path, prompt_tokens, args.n_predict, args.ctx, args.timeout, True)),
        ("(2) pipeinfer 1 rank, -t 1",
         lambda: run_pipeinfer(1, args.model, args.prompt, args.n_predict, args.ctx, None,
                               args.timeout)),
        ("(3) pipeinfer 2 ranks, split 0,1",
         lambda: run_pipeinfer(2, args.model, args.prompt, args.n_predict, args.ctx, "0,1",
                               args.timeout)),
    ]
    results: dict[str, list[dict]] = {name: [] for name, _ in configs}
    for rep in range(args.reps):
        for name, fn in configs:
            r = fn()
            results[name].append(r)
            extra = ""
            if "rank_stats" in r:
                extra = f"  busy {r.get('busy_fraction')}  ttft {r['ttft_s'] * 1e3:.1f} ms"
            print(f"  rep {rep + 1}  {name:34} {r['speed_tps']:7.3f} t/s  "
                  f"(process {r['launch_s']:.1f} s){extra}", flush=True)

    base_name = configs[0][0]
    base = statistics.mean(r["speed_tps"] for r in results[base_name])
    ref_tokens = results[base_name][0]["tokens"]
    print()
    header = f"{'configuration':36}" + "".join(f"{'rep ' + str(i + 1):>9}"
                                                for i in range(args.reps))
    print(header + f"{'mean t/s':>10}{'ratio':>8}  tokens")
    print("-" * (len(header) + 34))
    for name, _ in configs:
        speeds = [r["speed_tps"] for r in results[name]]
        avg = statistics.mean(speeds)
        same = all(r["tokens"] == ref_tokens for r in results[name])
        print(f"{name:36}" + "".join(f"{s:9.3f}" for s in speeds) +
              f"{avg:10.3f}{avg / base:8.3f}  {'= (1)' if same else 'DIFFER from (1)'}")
    mean = {name: statistics.mean(r["speed_tps"] for r in results[name]) for name, _ in configs}
    m1, m1f, m2, m3 = (mean[name] for name, _ in configs)
    print(f"\n(2)/(1)  = {m2 / m1:.3f}  (goal >= 0.95: {'met' if m2 / m1 >= 0.95 else 'MISSED'})")
    print(f"(3)/(1)  = {m3 / m1:.3f}")
    print(f"(2)/(1f) = {m2 / m1f:.3f}  (same attention kernel)")
    print(f"(3)/(1f) = {m3 / m1f:.3f}")
    print(f"(3)/(2)  = {m3 / m2:.3f}  (cost of the pipeline hop: embed, send, receive logits)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
