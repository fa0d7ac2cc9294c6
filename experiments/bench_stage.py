"""Overhead of a pipeinfer Stage against llama-cpp-python, and the cost of slices and batches.

For each model (default: smollm2 and qwen-coder-1.5b), on one thread:

  (a) llama-cpp-python's `Llama` decoding the whole model in single-token steps (`Llama.eval`)
  (b) one pipeinfer Stage holding every layer (the unsliced file, token ids in)
  (c) a middle slice holding about a third of the layers, fed activations: ms/token/layer,
      against (b)/n_layer (which also carries the input embedding and the output head)

(a), (b) and (c) are measured in alternation, repetition after repetition, so that load from
other processes on the machine hits them alike; the table reports medians and the median of
the per-repetition ratio (b)/(a) (goal: <= 1.03). Then the cost of a batch of n tokens with
logits for every row against a single token (what verifying a speculated micro-batch costs),
with the same alternation, and the time `pipeinfer split` needs for a 3-way split.

    .venv/bin/python experiments/bench_stage.py [--models smollm2,qwen-coder-1.5b] [--reps 5]

With `--hops TRACE` it measures nothing and prints instead where a token's time went between
the stages of a plain pipeline, read from a `pipeinfer run --strategy iterative --trace TRACE`,
and how busy each stage was while the prompt went in (experiments/harness/hops.py):

    .venv/bin/python experiments/bench_stage.py --hops trace.jsonl [--skip 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import llama_cpp
import numpy as np

from pipeinfer.model import llama_lib
from pipeinfer.model.embedding import Embedder
from pipeinfer.model.models import resolve_model
from pipeinfer.model.partition import StageRange, partition
from pipeinfer.model.slicing import model_info, read_model, split_model, write_stage
from pipeinfer.model.stage import Stage, StageConfig

if not __package__:   # run as `python experiments/NAME.py`: the repository on the path
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from experiments.harness import hops  # noqa: E402

N_CTX = 512
N_PREFIX = 64          # decode positions start here, as in DESIGN.md section 10
BATCH_SIZES = (1, 2, 3, 4, 8)


class Clock:
    """Wall time and this thread's CPU time. With one llama.cpp thread the compute runs on the
    calling thread, so CPU time leaves out the time other processes held the core: on a shared
    2-core machine it is the steadier of the two."""

    def __enter__(self):
        self.wall, self.cpu = time.perf_counter(), time.thread_time()
        return self

    def __exit__(self, *exc):
        self.wall = time.perf_counter() - self.wall
        self.cpu = time.thread_time() - self.cpu

    def per(self, n: int) -> tuple[float, float]:
        return self.wall / n, self.cpu / n


def silence_llama() -> None:
    """Keep llama.cpp's log off the table (Llama(verbose=False) only covers its own loads)."""
    llama_lib.init()


class LlamaRunner:
    """(a): llama-cpp-python's high-level Llama, one token per eval."""

    def __init__(self, path: Path):
        self.llm = llama_cpp.Llama(model_path=str(path), n_ctx=N_CTX, n_batch=N_PREFIX,
                                   n_threads=1, n_threads_batch=1, verbose=False)

    def prefill(self, tokens):
        self.llm.reset()
        self.llm.eval(tokens)

    def steps(self, tokens) -> tuple[float, float]:
        self.llm.n_tokens = N_PREFIX  # eval() drops cached positions >= n_tokens
        with Clock() as clock:
            for t in tokens:
                self.llm.eval([t])
        return clock.per(len(tokens))

    def close(self):
        self.llm.close()


class StageRunner:
    """(b) and (c): a pipeinfer Stage fed token ids (whole model) or activations (a slice)."""

    def __init__(self, path: Path, embed: Embedder | None = None, repack: bool = True):
        self.stage = Stage(path, StageConfig(n_ctx=N_CTX, n_batch=N_PREFIX, n_seq_max=8,
                                             n_threads=1, repack=repack))
        self.embed = embed

    def _inputs(self, tokens):
        if self.stage.final and self.embed is None:
            return {"tokens": tokens}
        return {"embd": self.embed(tokens)}

    def prefill(self, tokens):
        self.stage.clear()
        self.stage.decode(list(range(len(tokens))), [[0]] * len(tokens), **self._inputs(tokens))

    def steps(self, tokens) -> tuple[float, float]:
        self.stage.seq_rm(0, N_PREFIX, -1)
        inputs = [self._inputs([t]) for t in tokens]  # embeddings are the head's work, not ours
        with Clock() as clock:
            for i, x in enumerate(inputs):
                self.stage.decode([N_PREFIX + i], [[0]], **x)
        return clock.per(len(tokens))

    def batch(self, tokens) -> tuple[float, float]:
        """One decode of len(tokens) tokens at N_PREFIX.., logits (or activations) for every row."""
        self.stage.seq_rm(0, N_PREFIX, -1)
        n = len(tokens)
        x = self._inputs(tokens)
        with Clock() as clock:
            self.stage.decode(list(range(N_PREFIX, N_PREFIX + n)), [[0]] * n, **x)
        return clock.per(1)

    def close(self):
        self.stage.close()


def bench_model(name: str, reps: int, n_steps: int, batches: bool, work: Path) -> dict:
    path = resolve_model(name)
    info = model_info(read_model(path), path)
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(100, min(info.n_vocab, 30000), N_PREFIX)]
    steps = [int(t) for t in rng.integers(100, min(info.n_vocab, 30000), n_steps)]

    third = StageRange(1, info.n_layer // 3, 2 * info.n_layer // 3, False)
    slice_path = work / f"{name}-middle.gguf"
    write_stage(read_model(path), info, third, slice_path)

    embed = Embedder(path)
    runners = {"a": LlamaRunner(path), "b": StageRunner(path), "c": StageRunner(slice_path, embed)}
    for r in runners.values():
        r.prefill(prompt)
        r.steps(steps[:2])  # warm-up
    per_token = {k: [] for k in runners}
    for _ in range(reps):
        for k, r in runners.items():
            per_token[k].append(r.steps(steps))
    result = {"name": name, "n_layer": info.n_layer, "slice": third, "per_token": per_token}

    for r in runners.values():
        r.close()
    if batches:  # repacking on (the default) and off, alternating
        b = {True: StageRunner(path), False: StageRunner(path, repack=False)}
        cost = {(repack, n): [] for repack in b for n in BATCH_SIZES}
        for r in b.values():
            r.prefill(prompt)
        for _ in range(reps):
            for repack, r in b.items():
                for n in BATCH_SIZES:
                    cost[repack, n].append(r.batch(steps[:n]))
        result["batch"] = cost
        for r in b.values():
            r.close()
    return result


def ms(x: float) -> str:
    return f"{x * 1e3:.2f}"


def med(values, i: int) -> float:
    return statistics.median(v[i] for v in values)


def report(results: list[dict]) -> None:
    print(f"\nSingle-token decode, 1 thread, positions {N_PREFIX}.., median over repetitions, "
          "ms/token as CPU time (wall time)")
    print(f"{'model':16} {'layers':>6} {'(a) Llama':>16} {'(b) Stage':>16} {'(b)/(a) cpu':>11} "
          f"{'(b)/(a) wall':>12}")
    for r in results:
        a, b = r["per_token"]["a"], r["per_token"]["b"]
        cpu = statistics.median(y[1] / x[1] for x, y in zip(a, b))
        wall = statistics.median(y[0] / x[0] for x, y in zip(a, b))
        print(f"{r['name']:16} {r['n_layer']:6d} {ms(med(a, 1)):>7} ({ms(med(a, 0)):>6}) "
              f"{ms(med(b, 1)):>7} ({ms(med(b, 0)):>6}) {cpu:11.3f} {wall:12.3f}")
    print("  (b)/(a): median of the per-repetition ratios; goal <= 1.03")

    print("\nMiddle slice fed activations (c), CPU time per token per layer (ms)")
    print(f"{'model':16} {'slice':>8} {'(c) ms/token':>12} {'(c)/layer':>10} {'(b)/n_layer':>11} "
          f"{'ratio':>6}")
    for r in results:
        s = r["slice"]
        c, b = med(r["per_token"]["c"], 1), med(r["per_token"]["b"], 1)
        per_layer, whole_per_layer = c / s.n_layer, b / r["n_layer"]
        print(f"{r['name']:16} {f'[{s.first},{s.last})':>8} {ms(c):>12} {ms(per_layer):>10} "
              f"{ms(whole_per_layer):>11} {per_layer / whole_per_layer:6.3f}")
    print("  (b)/n_layer spreads the input embedding and the output head over the layers;")
    print("  a non-final slice has no output head, so it costs its layers only.")

    for r in results:
        if "batch" not in r:
            continue
        cost = r["batch"]
        print(f"\nBatch cost, {r['name']}, whole-model Stage, logits for every row, decode at "
              f"position {N_PREFIX}: ms per decode, median CPU time (wall)")
        print(f"{'repack':>6} {'batch':>6} {'cpu ms':>9} {'(wall)':>9} {'vs batch 1':>11} "
              f"{'(wall)':>7} {'ms/token':>9}")
        for repack in (True, False):
            one_cpu, one_wall = med(cost[repack, 1], 1), med(cost[repack, 1], 0)
            for n in BATCH_SIZES:
                c, w = med(cost[repack, n], 1), med(cost[repack, n], 0)
                print(f"{'on' if repack else 'off':>6} {n:6d} {ms(c):>9} {ms(w):>9} "
                      f"{c / one_cpu:11.2f} {w / one_wall:7.2f} {ms(c / n):>9}")


def bench_split(name: str, work: Path) -> None:
    path = resolve_model(name)
    t0 = time.perf_counter()
    info = model_info(read_model(path), path)
    t_header = time.perf_counter() - t0
    ranges = partition(info.n_layer, [0.34, 0.33, 0.33])
    t0 = time.perf_counter()
    split_model(path, ranges, work / f"split-{name}")
    t_split = time.perf_counter() - t0
    size = sum(p.stat().st_size for p in (work / f"split-{name}").glob("*.gguf"))
    print(f"  {name:18} 3-way split {t_split:6.2f} s ({size / 1e6:.0f} MB written; header "
          f"parse and checks {t_header:.2f} s)")


def bench_old_reader(name: str) -> None:
    """What the previous writer paid before writing a byte: gguf.GGUFReader over the file."""
    from gguf import GGUFReader

    t0 = time.perf_counter()
    GGUFReader(resolve_model(name), "r")
    print(f"  {name:18} gguf.GGUFReader parse alone (old writer's first step) "
          f"{time.perf_counter() - t0:6.2f} s")


def print_hops(trace: str, skip: int) -> int:
    records = hops.load(trace)
    segments = hops.breakdown(*records, skip)
    if not segments:
        print("bench_stage --hops: no complete runs in the trace", file=sys.stderr)
        return 1
    print(hops.report(segments))
    print(hops.prefill(*records))
    return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="smollm2,qwen-coder-1.5b")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--batch-model", default="qwen-coder-1.5b",
                    help="model whose batch-n vs batch-1 cost is measured")
    ap.add_argument("--old-reader", default="smollm2",
                    help="models to time gguf.GGUFReader on ('' for none)")
    ap.add_argument("--hops", metavar="TRACE",
                    help="print the cost per hop of an iterative run's trace, measure nothing")
    ap.add_argument("--skip", type=int, default=2,
                    help="with --hops: generated runs left out first")
    args = ap.parse_args()
    if args.hops:
        sys.exit(print_hops(args.hops, args.skip))
    silence_llama()
    print(f"llama.cpp: {llama_lib.system_info().strip()}")
    print(f"AMX compiled: {llama_lib.amx_compiled()} (repacking "
          f"{'off' if llama_lib.amx_compiled() else 'on'}); load average at start "
          f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-stage-") as tmp:
        work = Path(tmp)
        for name in args.models.split(","):
            n_steps = 32 if name == "smollm2" else 16
            t0 = time.perf_counter()
            results.append(bench_model(name, args.reps, n_steps, name == args.batch_model, work))
            print(f"{name}: measured in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        report(results)
        print("\nStage files")
        for name in args.models.split(","):
            bench_split(name, work)
        for name in filter(None, args.old_reader.split(",")):
            bench_old_reader(name)
    print(f"load average at end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
