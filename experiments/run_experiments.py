#!/usr/bin/env python3
"""Run the paper's experiment protocol (PipeInfer paper V-A) from a small TOML config.

    python experiments/run_experiments.py experiments/configs/paper.toml --out results.csv
    python experiments/run_experiments.py experiments/configs/smoke.toml \\
        --set target=tiny.gguf --set draft=tiny-draft.gguf --out smoke.csv
    python plot.py results.csv --out figures/

For every repeat x model pair x prompt x cluster setting x strategy (in that nesting, repeats
outermost so that slow drifts of the machine spread over all configurations) one job runs
through `mpiexec` (setting without CPU quota or link) or `experiments/cluster.py` (emulated
nodes: per-rank CPU quotas, shaped links). Each job appends one row to the results CSV, its
label recording the configuration: "pair=..;prompt=..;setting=..;variant=..". One progress
line per run; a failed run is reported and the rest still run; the exit status is 1 when any
run failed.

The config format is described in experiments/experiment_config.py.
"""

from __future__ import annotations

import argparse
import csv
import fnmatch
import hashlib
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

if not __package__:   # run as `python experiments/NAME.py`: the repository on the path
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from experiments.harness import CLUSTER  # noqa: E402
from experiments.harness.experiment_config import (  # noqa: E402
    OVERRIDABLE, Config, ConfigError, Pair, Prompt, Setting, Variant, load_config)

BIN = Path(sys.executable).parent


# --- jobs ------------------------------------------------------------------------------------
@dataclass
class Job:
    repeat: int
    pair: Pair
    prompt: Prompt
    setting: Setting
    variant: Variant

    @property
    def label(self) -> str:
        return (f"pair={self.pair.name};prompt={self.prompt.name};setting={self.setting.name};"
                f"variant={self.variant.name}")

    def key(self) -> dict[str, str]:
        return {"pair": self.pair.name, "prompt": self.prompt.name,
                "setting": self.setting.name, "variant": self.variant.name,
                "strategy": self.variant.strategy}


def jobs(config: Config, only: list[tuple[str, str]]) -> list[Job]:
    out = []
    for repeat in range(1, config.repeats + 1):
        for pair in config.pairs:
            for prompt in config.prompts:
                for setting in config.settings:
                    for variant in config.variants:
                        job = Job(repeat, pair, prompt, setting, variant)
                        key = job.key()
                        if all(fnmatch.fnmatchcase(key[k], pattern) for k, pattern in only):
                            out.append(job)
    return out


def tiny_models(name: str) -> str:
    """`tiny:target` / `tiny:draft`: deterministic tiny random llama models (written once)."""
    kind = name.split(":", 1)[1]
    if kind not in ("target", "draft"):
        raise ConfigError(f"unknown built-in model {name!r} (tiny:target or tiny:draft)")
    import gguf
    from tests.support import tinymodel
    root = Path(tempfile.gettempdir()) / f"pipeinfer-tiny-models-{os.getuid()}"
    root.mkdir(exist_ok=True)
    target = root / "tiny-q8.gguf"
    if not target.exists():
        tmp = tinymodel.write_tiny_llama(root / f"tiny-q8.{os.getpid()}.gguf", n_layer=4,
                                         tensor_type=gguf.GGMLQuantizationType.Q8_0)
        os.replace(tmp, target)
    draft = root / "tiny-draft.gguf"
    if kind == "draft" and not draft.exists():
        f32 = tinymodel.write_tiny_llama(root / f"tiny-f32.{os.getpid()}.gguf", n_layer=4)
        tmp = tinymodel.write_noisy_copy(f32, root / f"tiny-draft.{os.getpid()}.gguf",
                                         noise=0.05, seed=1)
        os.replace(tmp, draft)
        Path(f32).unlink(missing_ok=True)
    return str(target if kind == "target" else draft)


def model_arg(name: str, dry_run: bool) -> str:
    if name.startswith("tiny:") and not dry_run:
        return tiny_models(name)
    return name


def command(config: Config, job: Job, out: Path, dry_run: bool = False) -> list[str]:
    setting, variant = job.setting, job.variant
    run = [str(BIN / "pipeinfer"), "run", "-m", model_arg(job.pair.target, dry_run)]
    if variant.uses_draft:
        run += ["-md", model_arg(job.pair.draft, dry_run)]
    if job.prompt.file is not None:
        run += ["-f", str(job.prompt.file)]
    else:
        run += ["-p", job.prompt.text]
    if job.prompt.chat:
        run.append("--chat")
    run += ["-n", str(config.n_predict), "-t", setting.threads or config.threads,
            "--strategy", variant.strategy]
    split = setting.split_for(variant)
    if split is not None:
        run += ["--layer-split", split]
    run += config.extra + setting.extra + variant.flags
    run += ["--csv", str(out), "--label", job.label]
    if not setting.emulated:
        return [str(BIN / "mpiexec"), "-n", str(setting.ranks)] + run
    launcher = [sys.executable, str(CLUSTER), "--nodes", str(setting.ranks)]
    if setting.cpus is None:  # a link but no quota: quotas that never bind
        launcher += ["--cpu", str(os.cpu_count() or 1)]
    elif len(set(setting.cpus)) == 1:
        launcher += ["--cpu", f"{setting.cpus[0]:g}"]
    else:
        launcher += ["--cpus", ",".join(f"{c:g}" for c in setting.cpus)]
    launcher += ["--link", setting.link, "--timeout", f"{config.timeout:g}"]
    if setting.period_us:
        launcher += ["--period-us", str(setting.period_us)]
    return launcher + ["--"] + run


# --- running ---------------------------------------------------------------------------------
def csv_rows(path: Path) -> list[dict]:
    if not path.exists() or path.stat().st_size == 0:
        return []
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def run_job(cmd: list[str], timeout: float, log) -> tuple[int, str, str, bool]:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            errors="replace", stdin=subprocess.DEVNULL, start_new_session=True)
    timed_out = False
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        for sig in (signal.SIGINT, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=15)
                break
            except subprocess.TimeoutExpired:
                continue
        out, err = proc.communicate()
    if log is not None:
        log.write_text(f"$ {shlex.join(cmd)}\n--- stdout ---\n{out}\n--- stderr ---\n{err}")
    return proc.returncode, out, err, timed_out


def fmt(value: str, scale: float = 1.0, digits: int = 2, unit: str = "") -> str:
    try:
        return f"{float(value) * scale:.{digits}f}{unit}"
    except (TypeError, ValueError):
        return "-"


def describe(row: dict) -> str:
    text = (f"{fmt(row.get('speed_tps'))} t/s, TTFT {fmt(row.get('ttft_s'), 1000, 1, ' ms')}, "
            f"ITL {fmt(row.get('itl_s'), 1000, 1, ' ms')}, {row.get('n_generated', '?')} tokens")
    if row.get("accept_rate"):
        text += f", acceptance {fmt(row['accept_rate'])}"
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Filters: --only variant=pipeinfer* --only setting=4n-*  (keys: pair, prompt, "
               "setting, variant, strategy; shell-style patterns).")
    parser.add_argument("config", help="TOML experiment config")
    parser.add_argument("--out", default="results.csv", help="results CSV (rows are appended)")
    parser.add_argument("--repeats", type=int, help="repeat every run K times (overrides config)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help=f"override a config value ({', '.join(sorted(OVERRIDABLE))}); "
                             "target/draft replace the models of every pair")
    parser.add_argument("--only", action="append", default=[], metavar="KEY=PATTERN",
                        help="run only the jobs matching (repeatable)")
    parser.add_argument("--logs", help="directory for each run's stdout/stderr")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = parser.parse_args(argv)

    def die(message: str) -> int:
        print(f"run_experiments: error: {message}", file=sys.stderr)
        return 2

    overrides = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            return die(f"--set needs KEY=VALUE, not {item!r}")
        overrides[key.strip()] = value
    if args.repeats is not None:
        if args.repeats < 1:
            return die("--repeats must be at least 1")
        overrides["repeats"] = str(args.repeats)
    only = []
    for item in args.only:
        key, sep, pattern = item.partition("=")
        if not sep or key not in ("pair", "prompt", "setting", "variant", "strategy"):
            return die(f"--only needs KEY=PATTERN with KEY one of pair, prompt, setting, "
                       f"variant, strategy; not {item!r}")
        only.append((key, pattern))
    try:
        config = load_config(args.config, overrides)
        todo = jobs(config, only)
        if not todo:
            return die("no run matches the --only filters")
        out = Path(args.out).resolve()
        commands = [command(config, job, out, args.dry_run) for job in todo]
    except ConfigError as err:
        return die(str(err))

    if args.dry_run:
        for i, (job, cmd) in enumerate(zip(todo, commands), 1):
            print(f"# [{i}/{len(todo)}] repeat={job.repeat};{job.label}")
            print(shlex.join(cmd))
        return 0

    if any(job.setting.emulated for job in todo) and os.geteuid() != 0:
        print("run_experiments: warning: emulated cluster settings need root; those runs "
              "will fail", file=sys.stderr)
    out.parent.mkdir(parents=True, exist_ok=True)
    logs = Path(args.logs) if args.logs else None
    if logs is not None:
        logs.mkdir(parents=True, exist_ok=True)
    width = len(str(len(todo)))
    failures: list[str] = []
    texts: dict[tuple, tuple[str, str]] = {}
    started = time.perf_counter()
    print(f"run_experiments: {len(todo)} run(s) from {config.path} -> {out}", flush=True)
    for i, (job, cmd) in enumerate(zip(todo, commands), 1):
        head = f"[{i:>{width}}/{len(todo)}] r{job.repeat} {job.label}"
        before = len(csv_rows(out))
        log = None
        if logs is not None:
            digest = hashlib.sha1(f"{job.repeat}{job.label}".encode()).hexdigest()[:8]
            log = logs / f"{i:04d}-{job.variant.name}-{digest}.log"
        t0 = time.perf_counter()
        rc, stdout, stderr, timed_out = run_job(cmd, config.timeout + 30, log)
        elapsed = time.perf_counter() - t0
        rows = csv_rows(out)
        new = rows[before:]
        if rc == 0 and len(new) == 1:
            print(f"{head}: {describe(new[0])} ({elapsed:.1f} s)", flush=True)
            key = (job.pair.name, job.prompt.name, job.setting.name)
            reference = texts.setdefault(key, (job.variant.name, stdout))
            if reference[1] != stdout:
                print(f"    note: output differs from {reference[0]}'s for the same pair, "
                      "prompt and setting", flush=True)
            continue
        why = "timed out" if timed_out else f"exit status {rc}" if rc != 0 else \
            f"{len(new)} new CSV row(s) instead of 1"
        tail = [line for line in stderr.strip().splitlines() if line.strip()][-6:]
        print(f"{head}: FAILED ({why}, {elapsed:.1f} s)", flush=True)
        for line in tail:
            print(f"    | {line}", flush=True)
        failures.append(f"r{job.repeat} {job.label}: {why}")
    total = time.perf_counter() - started
    print(f"run_experiments: {len(todo) - len(failures)} of {len(todo)} run(s) succeeded in "
          f"{total:.0f} s; results in {out}", flush=True)
    if failures:
        print(f"run_experiments: {len(failures)} run(s) failed:", file=sys.stderr)
        for failure in failures:
            print(f"  {failure}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # e.g. --dry-run | head
        sys.stderr.close()
        sys.exit(0)
