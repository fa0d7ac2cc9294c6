#!/usr/bin/env python3
"""PipeSpec's model hierarchy on the Qwen2.5-Coder models: M0 = the first --m0-layers layers of
the 0.5B model (with its output head), M1 = the 0.5B model, target = the 1.5B model.

Runs, interleaved K times, on --ranks ranks (default 2: the head drafts and holds no target
layers, one worker holds the whole target):
  iterative                     the baseline
  pipeinfer   0.5B -> 1.5B      asynchronous speculation with one draft
  pipespec    0.5B -> 1.5B      2-model hierarchy
  pipespec    M0 -> 0.5B -> 1.5B  3-model hierarchy
  pipespec2-ranks, pipespec3-ranks (with --configs): the same with every draft model on a rank
              of its own after the target's (--layer-split SPLIT/1[/1], more ranks)
and prints, per configuration, the median speed, the per-stage acceptance rates, tokens and
step times (the `pipespec_stages` of the run's JSON) and PipeSpec's analytic expectation
(eq. 1-3) computed from them. Every output must be identical (greedy).

    python experiments/bench_pipespec.py -n 128 -k 2
    python experiments/bench_pipespec.py -n 16 -k 1 --configs pipespec3   # smoke
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
PROMPT = ("Write a Python function that parses a CSV file of transactions (date, amount, "
          "category) and returns the total amount per category, sorted by amount.")
CONFIGS = {  # name -> (strategy, drafts: "m0" / "m1")
    "iterative": ("iterative", ()),
    "pipeinfer": ("pipeinfer", ("m1",)),
    "pipespec2": ("pipespec", ("m1",)),
    "pipespec3": ("pipespec", ("m0", "m1")),
    "pipespec2-ranks": ("pipespec", ("m1",)),
    "pipespec3-ranks": ("pipespec", ("m0", "m1")),
}
DEFAULT_CONFIGS = ("iterative", "pipeinfer", "pipespec2", "pipespec3")


def make_m0(m1: Path, layers: int, out_dir: Path) -> Path:
    """The first `layers` layers of the draft model plus its output head (a self-draft)."""
    from pipeinfer.model.partition import StageRange
    from pipeinfer.model.slicing import model_info, open_model, write_stage

    dst = out_dir / f"{m1.stem}-first{layers}.gguf"
    if not dst.exists():
        reader = open_model(m1)
        info = model_info(reader, m1)
        if not 0 < layers < info.n_layer:
            raise SystemExit(f"--m0-layers must be in 1..{info.n_layer - 1}")
        write_stage(reader, info, StageRange(0, 0, layers, True), dst, keep_tokenizer=True)
    return dst


def run_config(name: str, models: dict, args) -> dict:
    strategy, drafts = CONFIGS[name]
    split, ranks = args.split, args.ranks
    if name.endswith("-ranks"):  # a rank of its own per draft model
        split, ranks = split + "/1" * len(drafts), ranks + len(drafts)
    cmd = [str(BIN / "pipeinfer"), "run", "-m", str(models["target"]), "-p", PROMPT, "--chat",
           "-n", str(args.n), "--ignore-eos", "--strategy", strategy, "--layer-split",
           split, "-t", "1", "--json"] + args.extra
    for d in drafts:
        cmd += ["-md", str(models[d])]
    launch = [str(BIN / "mpiexec"), "-n", str(ranks)] + cmd
    out = subprocess.run(launch, capture_output=True, text=True, timeout=args.timeout)
    if out.returncode != 0:
        raise SystemExit(f"{name} failed ({out.returncode}):\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def stage_table(runs: list[dict]) -> list[str]:
    """Per-stage medians over the runs of one configuration, and the expectation."""
    lines = [f"  {'model':34} {'role':7} {'accepted/proposed':>17} {'alpha':>6} "
             f"{'produced':>8} {'steps':>6} {'step ms':>8} {'t/s':>9} {'rollbacks':>9}"]
    for i, row in enumerate(runs[0]["pipespec_stages"]):
        rows = [r["pipespec_stages"][i] for r in runs]
        get = lambda key: median(x[key] for x in rows)  # noqa: E731
        alpha, step, tps = get("rate"), get("step_s"), get("tokens_per_s")
        counts = f"{get('accepted'):.0f}/{get('proposed'):.0f}"
        alpha = "-" if alpha is None else f"{alpha:.3f}"
        step = "-" if step is None else f"{step * 1000:.2f}"
        tps = "-" if tps is None else f"{tps:.2f}"
        model = row["model"] if len(row["model"]) <= 31 else \
            row["model"][:12] + "~" + row["model"][-18:]
        lines.append(
            f"  M{i} {model:31} {row['role']:7} {counts:>17} {alpha:>6} "
            f"{get('produced'):8.0f} {get('steps'):6.0f} {step:>8} {tps:>9} "
            f"{get('rollbacks'):9.0f}")
    for i, st in enumerate(runs[0]["pipespec_expected"]["stages"]):
        vals = [r["pipespec_expected"]["stages"][i] for r in runs]
        if st.get("alpha") is None:
            continue
        n = median(v["tokens_per_step"] for v in vals)
        tps = median(v["expected_tps"] for v in vals)
        lines.append(f"  expected at M{i + 1} {st['model']}: alpha {st['alpha']:.3f}, gamma "
                     f"{st['gamma']:.2f}, rho {st['rho']:.3f}: {n:.3f} tokens/step"
                     + (f", {tps:.2f} t/s" if tps else ""))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="qwen-coder-1.5b")
    parser.add_argument("--m1", default="qwen-coder-0.5b", help="the middle model (0.5B)")
    parser.add_argument("--m0", default=None, help="M0 GGUF (default: sliced from --m1)")
    parser.add_argument("--m0-layers", type=int, default=12,
                        help="layers of --m1 kept for M0 (its output head has about as many "
                             "weights as 9 of the 0.5B's 24 layers; 6 layers agreed with the 0.5B "
                             "on no token in a smoke run)")
    parser.add_argument("--work-dir", default=None, help="where M0 is written")
    parser.add_argument("--configs", default=",".join(DEFAULT_CONFIGS),
                        help=f"comma list of {', '.join(CONFIGS)}")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--split", default="0,1")
    parser.add_argument("-n", type=int, default=128)
    parser.add_argument("-k", type=int, default=2, help="repetitions (interleaved)")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("extra", nargs="*", help="extra pipeinfer run flags (after --)")
    args = parser.parse_args()

    from pipeinfer.model.models import cache_dir, resolve_model

    target, m1 = resolve_model(args.target), resolve_model(args.m1)
    work = Path(args.work_dir) if args.work_dir else cache_dir() / "derived"
    work.mkdir(parents=True, exist_ok=True)
    m0 = Path(args.m0) if args.m0 else make_m0(m1, args.m0_layers, work)
    models = {"target": target, "m1": m1, "m0": m0}
    names = args.configs.split(",")
    results: dict[str, list[dict]] = {n: [] for n in names}
    for rep in range(args.k):
        for name in names:
            t0 = time.time()
            results[name].append(run_config(name, models, args))
            print(f"# rep {rep} {name}: {results[name][-1]['speed_tps']} t/s "
                  f"({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
    report(results, models, args)


def report(results: dict[str, list[dict]], models: dict, args) -> None:
    first = next(iter(results.values()))[0]["tokens"]
    exact = all(r["tokens"] == first for rs in results.values() for r in rs)
    print(f"\ntarget {models['target'].name}, M1 {models['m1'].name}, M0 {models['m0'].name}; "
          f"{args.ranks} ranks, split {args.split}, {args.n} tokens; "
          f"outputs identical: {exact}")
    base = median(r["speed_tps"] for r in results.get("iterative", []))
    for name, runs in results.items():
        speed = median(r["speed_tps"] for r in runs)
        ratio = f" ({speed / base:.2f}x iterative)" if base and speed else ""
        acc = median(r["accept_rate"] for r in runs)
        print(f"{name:10} {speed or 0:8.2f} t/s{ratio}"
              + ("" if acc is None else f"; target acceptance {acc:.3f}"))
        if runs[0].get("pipespec_stages"):
            print("\n".join(stage_table(runs)))


if __name__ == "__main__":
    main()
