#!/usr/bin/env python3
"""`--layer-split auto` against the even split on emulated clusters, and the simulator's
prediction of every run, in one script run.

Per setting: `pipeinfer calibrate` under the setting's quotas writes a profile; then K
interleaved repeats of every strategy with the even split and with `--layer-split auto
--profile P` (Qwen2.5-Coder 1.5B + 0.5B, the coding chat prompt, -n tokens, EOS ignored);
then `pipeinfer simulate --profile P` on each split. Prints per setting, strategy and split
the measured t/s (every repeat and the median), the predicted t/s and its error, and the
median of the per-repeat ratios auto / even.

    python experiments/bench_plan.py --settings het,4n -k 3 -n 64
    python experiments/bench_plan.py --settings 8n --strategies speculative --reuse-profile
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

if not __package__:   # run as `python experiments/NAME.py`: the repository on the path
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from experiments.harness import CLUSTER  # noqa: E402
from experiments.harness.cluster_run import failure, run_cluster  # noqa: E402
from experiments.harness.cpu_quota import host_cpu  # noqa: E402
BIN = Path(sys.executable).parent
PROMPT = ("Write a Python function that parses a CSV file of transactions (date, amount, "
          "category) and returns the total amount per category, sorted by amount.")
SETTINGS = {
    "het": {"cluster": ["--cpus", "0.6,0.6,0.6,0.2"], "nodes": 4, "even": "0,0.34,0.33,0.33"},
    "4n": {"cluster": ["--nodes", "4", "--cpu", "0.5"], "nodes": 4, "even": "0,0.34,0.33,0.33"},
    "8n": {"cluster": ["--nodes", "8", "--cpu", "0.25"], "nodes": 8,
           "even": "0," + ",".join(["0.142857142857"] * 6 + ["0.142857142858"])},
}


def cluster(setting: dict, args, *command: str) -> str:
    """The standard output of `command` run on the setting's emulated cluster."""
    launch = [sys.executable, str(CLUSTER), *setting["cluster"]]
    if "--nodes" not in setting["cluster"]:
        launch += ["--nodes", str(setting["nodes"])]
    if args.link != "none":
        launch += ["--link", args.link]
    code, stdout, stderr = run_cluster(launch + ["--", *command], args.timeout)
    if code != 0:
        how = failure(code, args.timeout)
        raise SystemExit(f"{how}: {' '.join(command[:4])}...\n{stderr[-2500:]}")
    return stdout


def run(setting: dict, args, strategy: str, split: str, profile: Path) -> dict:
    cmd = [str(BIN / "pipeinfer"), "run", "-m", args.model, "-p", PROMPT, "--chat", "-n",
           str(args.n), "--ignore-eos", "--strategy", strategy, "--layer-split", split,
           "--json", "-q"]
    if strategy != "iterative":
        cmd += ["-md", args.draft]
    if split == "auto":
        cmd += ["--profile", str(profile)]
    return json.loads(cluster(setting, args, *cmd).strip().splitlines()[-1])


def simulate(args, strategy: str, split: str, profile: Path) -> dict:
    cmd = [str(BIN / "pipeinfer"), "simulate", "--profile", str(profile), "-m", args.model,
           "--strategy", strategy, "--layer-split", split, "-n", str(args.n), "--json",
           "--link", args.link]
    if strategy != "iterative":
        cmd += ["-md", args.draft]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    if out.returncode != 0:
        raise SystemExit(f"simulate failed: {out.stderr[-1500:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def bench(name: str, args, strategies: list[str], outdir: Path) -> list[dict]:
    setting = SETTINGS[name]
    profile = outdir / f"profile-{name}.json"
    t0 = time.time()
    if args.reuse_profile and profile.exists():
        print(f"# {name}: profile {profile} reused", flush=True)
    else:
        out = cluster(setting, args, str(BIN / "pipeinfer"), "calibrate", "-m", args.model,
                      "-md", args.draft, "--profile", str(profile))
        print(f"# {name}: calibrated in {time.time() - t0:.0f} s\n{out}", flush=True)
    runs: dict[tuple[str, str], list[dict]] = {}
    for rep in range(args.k):
        for strategy in strategies:
            for split in (setting["even"], "auto"):
                t0 = time.time()
                r = run(setting, args, strategy, split, profile)
                runs.setdefault((strategy, split), []).append(r)
                print(f"# {name} rep {rep} {strategy} {split}: {r['speed_tps']:.3f} t/s, "
                      f"split {r['split']} ({time.time() - t0:.0f} s)", flush=True)
    rows = []
    for (strategy, split), rs in runs.items():
        used = rs[0]["split"]
        counts = [last - first for first, last in rs[0]["layer_split"]]
        exact = ",".join(f"{c / sum(counts):.12g}" for c in counts)
        try:
            pred = simulate(args, strategy, exact, profile)
        except SystemExit as err:  # keep the measurements
            print(f"# {err}", flush=True)
            pred = {"speed_tps": float("nan"), "layers": counts, "assumed_accept_rate": None}
        speeds = [r["speed_tps"] for r in rs]
        rows.append({"setting": name, "strategy": strategy, "split": split, "layers": used,
                     "speeds": speeds, "median": statistics.median(speeds),
                     "predicted": pred["speed_tps"], "pred_layers": pred["layers"],
                     "accept_measured": statistics.median(r["accept_rate"] or 0 for r in rs),
                     "accept_assumed": pred["assumed_accept_rate"],
                     "runs": [{k: r.get(k) for k in ("speed_tps", "itl_s", "ttft_s",
                                                     "accept_rate", "busy_fraction",
                                                     "runs_started", "mean_microbatch")}
                              for r in rs],
                     "sim": pred})
    return rows


def resimulate(row: dict, args, outdir: Path) -> dict:
    layers = row["pred_layers"]
    exact = ",".join(f"{c / sum(layers):.12g}" for c in layers)
    pred = simulate(args, row["strategy"], exact, outdir / f"profile-{row['setting']}.json")
    return {**row, "predicted": pred["speed_tps"], "sim": pred}


def report(rows: list[dict]) -> None:
    print(f"\n{'setting':7} {'strategy':10} {'split':18} {'t/s (each repeat)':26} {'median':>7} "
          f"{'sim':>6} {'error':>6} {'auto/even':>9}")
    for row in rows:
        even = next((r for r in rows if r["setting"] == row["setting"] and
                     r["strategy"] == row["strategy"] and r["split"] != "auto"), None)
        ratio = ""
        if row["split"] == "auto" and even:
            ratio = f"{statistics.median(a / e for a, e in zip(row['speeds'], even['speeds'])):.2f}x"
        error = (row["predicted"] - row["median"]) / row["median"]
        label = "auto " + row["layers"] if row["split"] == "auto" else row["split"]
        each = ",".join(f"{s:.2f}" for s in row["speeds"])
        print(f"{row['setting']:7} {row['strategy']:10} {label[:18]:18} {each:26} "
              f"{row['median']:7.2f} {row['predicted']:6.2f} {100 * error:+5.0f}% {ratio:>9}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen-coder-1.5b")
    parser.add_argument("--draft", default="qwen-coder-0.5b")
    parser.add_argument("--settings", default="het,4n")
    parser.add_argument("--strategies", default="iterative,pipeinfer")
    parser.add_argument("--link", default="none")
    parser.add_argument("-n", type=int, default=64)
    parser.add_argument("-k", type=int, default=3, help="repeats (interleaved)")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--out", default="bench-plan", help="directory for profiles and JSON")
    parser.add_argument("--resimulate", action="store_true",
                        help="run nothing: predict the rows in --out again (a changed "
                             "simulator) from their profiles, and report")
    parser.add_argument("--reuse-profile", action="store_true",
                        help="use the setting's profile in --out if there is one (strategies "
                             "benchmarked in separate runs share one calibration); the rows "
                             "of earlier runs in --out are kept and reported too")
    args = parser.parse_args()
    outdir = Path(args.out)
    outdir.mkdir(parents=True, exist_ok=True)
    print(f"# host {platform.node()}: {host_cpu()}; {time.strftime('%Y-%m-%d %H:%M')}", flush=True)
    saved = outdir / "rows.json"
    if args.resimulate:
        rows = [resimulate(row, args, outdir) for row in json.loads(saved.read_text())]
        saved.write_text(json.dumps(rows, indent=1))
        report(rows)
        return
    rows = json.loads(saved.read_text()) if args.reuse_profile and saved.exists() else []
    for name in args.settings.split(","):
        new = bench(name, args, args.strategies.split(","), outdir)
        keys = {(r["setting"], r["strategy"], r["split"]) for r in new}
        rows = [r for r in rows if (r["setting"], r["strategy"], r["split"]) not in keys] + new
        saved.write_text(json.dumps(rows, indent=1))
    report(rows)


if __name__ == "__main__":
    main()
