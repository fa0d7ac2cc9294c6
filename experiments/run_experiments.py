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

Config (all keys but pairs/prompts/settings optional; see experiments/configs/*.toml):

    n_predict = 512            # tokens per run
    threads = 1                # threads per rank (number or "1,2,...")
    repeats = 1
    timeout = 3600             # seconds per run
    extra = ["--ignore-eos"]   # flags for every run
    strategies = ["iterative", "speculative", "pipeinfer",
                  {name = "pipeinfer-nocancel", strategy = "pipeinfer", flags = ["--no-cancel"]}]

    [[pairs]]                  # target/draft: GGUF path or cached model name; ${VAR} and
    name = "qwen"              # ${VAR:-default} are expanded; "tiny:target" / "tiny:draft"
    target = "qwen-coder-1.5b" # are generated tiny random models (smoke tests)
    draft = "qwen-coder-0.5b"

    [[prompts]]
    name = "code"
    chat = true
    text = "..."               # or file = "prompts/x.txt" (relative to the config)

    [[settings]]               # list values expand to every combination
    ranks = [2, 4, 8]
    cpu = "2/N"                # cores per node: a number, or "C/N" = C cores shared by N nodes;
    link = ["none", "gigabit"] # omitted (and link none) = plain mpiexec
    cpus = [0.5, 0.5, 0.2]     # per-node quotas instead of cpu (heterogeneous cluster)
    head_share = 0.0           # strategies with a draft: rank 0's layer share, rest equal
    layer_split = "0.5,0.5"    # explicit split for every strategy
    name = "{ranks}n-{link}"   # default name; placeholders: ranks, link, cpu
"""

from __future__ import annotations

import argparse
import csv
import fnmatch
import hashlib
import itertools
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
CLUSTER = HERE / "cluster.py"
BIN = Path(sys.executable).parent
BASE_STRATEGIES = ("iterative", "speculative", "pipeinfer")  # the paper's, the default order
KNOWN_STRATEGIES = BASE_STRATEGIES + ("pipespec", "specpipe")
LINKS = ("none", "gigabit", "slow")
TOP_KEYS = {"name", "description", "n_predict", "threads", "repeats", "timeout", "extra",
            "strategies", "variants", "pairs", "prompts", "settings"}
SETTING_KEYS = {"name", "ranks", "cpu", "cpus", "link", "head_share", "layer_split", "threads",
                "extra", "period_us"}
OVERRIDABLE = {"target", "draft", "n_predict", "threads", "repeats", "timeout"}


class ConfigError(Exception):
    pass


# --- configuration ---------------------------------------------------------------------------
@dataclass
class Pair:
    name: str
    target: str
    draft: str | None


@dataclass
class Prompt:
    name: str
    chat: bool
    text: str | None = None
    file: Path | None = None


@dataclass
class Variant:
    name: str
    strategy: str
    flags: list[str] = field(default_factory=list)

    @property
    def uses_draft(self) -> bool:
        return self.strategy != "iterative"


@dataclass
class Setting:
    name: str
    ranks: int
    cpus: list[float] | None  # None: no CPU quota
    link: str
    head_share: float | None = None
    layer_split: str | None = None
    threads: str | None = None
    extra: list[str] = field(default_factory=list)
    period_us: int | None = None

    @property
    def emulated(self) -> bool:
        return self.cpus is not None or self.link != "none"

    def split_for(self, variant: Variant) -> str | None:
        if self.layer_split is not None:
            return self.layer_split
        if self.head_share is not None and variant.uses_draft and self.ranks > 1:
            return head_split(self.ranks, self.head_share)
        return None


@dataclass
class Config:
    path: Path
    n_predict: int
    threads: str
    repeats: int
    timeout: float
    extra: list[str]
    variants: list[Variant]
    pairs: list[Pair]
    prompts: list[Prompt]
    settings: list[Setting]


def head_split(ranks: int, head: float) -> str:
    """Rank 0 gets `head` of the layers, the other ranks equal parts of the rest."""
    if not 0 <= head < 1:
        raise ConfigError(f"head_share must be in [0, 1), not {head}")
    rest = (1 - head) / (ranks - 1)
    shares = [head] + [rest] * (ranks - 1)
    text = [f"{s:.6f}".rstrip("0").rstrip(".") or "0" for s in shares[:-1]]
    last = 1 - sum(float(t) for t in text)
    return ",".join(text + [f"{last:.6f}".rstrip("0").rstrip(".")])


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def expand(value: str, what: str) -> str:
    """${VAR} and ${VAR:-default} from the environment; an unset ${VAR} is an error."""
    def sub(match: re.Match) -> str:
        name, default = match.group(1), match.group(2)
        if os.environ.get(name):
            return os.environ[name]
        if default is not None:
            return default
        raise ConfigError(f"{what} needs the environment variable {name} (or --set "
                          f"{what.split('.')[-1]}=...)")
    return _VAR.sub(sub, value)


def _flags(value, what: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return shlex.split(value)
    if isinstance(value, list) and all(isinstance(v, (str, int, float)) for v in value):
        return [str(v) for v in value]
    raise ConfigError(f"{what} must be a list of strings or one string of flags")


def _name(value: str, what: str) -> str:
    if not isinstance(value, str) or not value or re.search(r"[;=\s]", value):
        raise ConfigError(f"{what} {value!r} must be a non-empty name without ';', '=' or spaces")
    return value


def _threads(value, what: str) -> str:
    if isinstance(value, int) and value >= 1:
        return str(value)
    if isinstance(value, str) and re.fullmatch(r"\d+(,\d+)*", value):
        return value
    raise ConfigError(f"{what} must be a positive number or a comma list like \"1,2\"")


def _as_list(value) -> list:
    return value if isinstance(value, list) else [value]


def parse_variants(raw: dict) -> list[Variant]:
    items = list(raw.get("strategies", list(BASE_STRATEGIES))) + list(raw.get("variants", []))
    variants: list[Variant] = []
    for item in items:
        if isinstance(item, str):
            item = {"name": item, "strategy": item}
        if not isinstance(item, dict):
            raise ConfigError(f"a strategy must be a name or a table, not {item!r}")
        unknown = set(item) - {"name", "strategy", "flags"}
        if unknown:
            raise ConfigError(f"unknown key(s) in strategy {item.get('name')!r}: "
                              f"{', '.join(sorted(unknown))}")
        strategy = item.get("strategy", item.get("name"))
        if strategy not in KNOWN_STRATEGIES:
            raise ConfigError(f"unknown strategy {strategy!r} (choose from "
                              f"{', '.join(KNOWN_STRATEGIES)})")
        name = _name(item.get("name", strategy), "strategy name")
        variants.append(Variant(name, strategy, _flags(item.get("flags"), f"flags of {name}")))
    if not variants:
        raise ConfigError("no strategies to run")
    names = [v.name for v in variants]
    if len(set(names)) != len(names):
        raise ConfigError(f"strategy names repeat: {names}")
    return variants


def parse_settings(raw: list, path: Path) -> list[Setting]:
    settings: list[Setting] = []
    for i, table in enumerate(raw):
        if not isinstance(table, dict):
            raise ConfigError(f"settings[{i}] must be a table")
        unknown = set(table) - SETTING_KEYS
        if unknown:
            raise ConfigError(f"unknown key(s) in settings[{i}]: {', '.join(sorted(unknown))}")
        if "ranks" not in table:
            raise ConfigError(f"settings[{i}] needs ranks")
        if "cpu" in table and "cpus" in table:
            raise ConfigError(f"settings[{i}]: give cpu or cpus, not both")
        for ranks, link, cpu in itertools.product(_as_list(table["ranks"]),
                                                  _as_list(table.get("link", "none")),
                                                  _as_list(table.get("cpu", None))):
            if not isinstance(ranks, int) or ranks < 1:
                raise ConfigError(f"settings[{i}]: ranks must be positive integers")
            if link not in LINKS:
                raise ConfigError(f"settings[{i}]: link {link!r} is not one of {', '.join(LINKS)}")
            cpus = None
            if "cpus" in table:
                cpus = [float(c) for c in table["cpus"]]
                if len(cpus) != ranks:
                    raise ConfigError(f"settings[{i}]: cpus has {len(cpus)} values for "
                                      f"{ranks} ranks")
            elif cpu is not None:
                cpus = [quota(cpu, ranks, f"settings[{i}].cpu")] * ranks
            if cpus is not None and any(c <= 0 for c in cpus):
                raise ConfigError(f"settings[{i}]: CPU quotas must be positive")
            cpu_text = "-" if cpus is None else "/".join(f"{c:g}" for c in dict.fromkeys(cpus))
            default = f"{ranks}n-{link}" + ("" if cpus is None else f"-q{cpu_text}")
            template = table.get("name", default)
            try:
                name = template.format(ranks=ranks, link=link, cpu=cpu_text)
            except (KeyError, IndexError, ValueError) as err:
                raise ConfigError(f"settings[{i}]: bad name template {template!r}: {err}") \
                    from None
            setting = Setting(
                name=_name(name, "setting name"), ranks=ranks, cpus=cpus, link=link,
                head_share=table.get("head_share"), layer_split=table.get("layer_split"),
                threads=_threads(table["threads"], f"settings[{i}].threads")
                if "threads" in table else None,
                extra=_flags(table.get("extra"), f"settings[{i}].extra"),
                period_us=table.get("period_us"))
            if setting.layer_split is not None and \
                    len(setting.layer_split.split(",")) != ranks:
                raise ConfigError(f"settings[{i}]: layer_split {setting.layer_split!r} needs "
                                  f"{ranks} shares")
            period = setting.period_us or 10000  # cluster.py's default CFS period
            if cpus is not None and min(cpus) * period < 1000:
                raise ConfigError(f"settings[{i}] ({name}): a quota of {min(cpus):g} cores is "
                                  f"under the kernel's 1 ms minimum per {period} us period; "
                                  f"set period_us to at least {int(1000 / min(cpus)) + 1}")
            if setting.head_share is not None:
                head_split(max(ranks, 2), float(setting.head_share))  # validate
            settings.append(setting)
    names = [s.name for s in settings]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ConfigError(f"setting names repeat: {', '.join(sorted(dup))} (give distinct names)")
    if not settings:
        raise ConfigError(f"{path}: no settings")
    return settings


def quota(value, ranks: int, what: str) -> float:
    """A number of cores, or "C/N": C cores shared by the N ranks."""
    if isinstance(value, (int, float)):
        return float(value)
    match = re.fullmatch(r"\s*([0-9.]+)\s*/\s*N\s*", str(value))
    if not match:
        raise ConfigError(f"{what} must be a number of cores or \"C/N\", not {value!r}")
    return float(match.group(1)) / ranks


def load_config(path: str | os.PathLike, overrides: dict[str, str] | None = None) -> Config:
    path = Path(path)
    overrides = dict(overrides or {})
    unknown = set(overrides) - OVERRIDABLE
    if unknown:
        raise ConfigError(f"--set accepts {', '.join(sorted(OVERRIDABLE))}, not "
                          f"{', '.join(sorted(unknown))}")
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config {path} does not exist") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: {err}") from None
    unknown = set(raw) - TOP_KEYS
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {', '.join(sorted(unknown))}")
    for key in ("pairs", "prompts", "settings"):
        if not raw.get(key):
            raise ConfigError(f"{path}: needs at least one [[{key}]]")

    pairs = []
    for i, table in enumerate(raw["pairs"]):
        target = overrides.get("target", table.get("target"))
        draft = overrides.get("draft", table.get("draft"))
        if not target:
            raise ConfigError(f"pairs[{i}] needs a target")
        name = _name(table.get("name", f"pair{i}"), "pair name")
        pairs.append(Pair(name, expand(str(target), f"pairs.{name}.target"),
                          expand(str(draft), f"pairs.{name}.draft") if draft else None))

    prompts = []
    for i, table in enumerate(raw["prompts"]):
        name = _name(table.get("name", f"prompt{i}"), "prompt name")
        if ("text" in table) == ("file" in table):
            raise ConfigError(f"prompt {name}: give exactly one of text or file")
        file = None
        if "file" in table:
            file = (path.parent / table["file"]).resolve()
            if not file.is_file():
                raise ConfigError(f"prompt {name}: file {file} does not exist")
        prompts.append(Prompt(name, bool(table.get("chat", False)), table.get("text"), file))

    variants = parse_variants(raw)
    if any(v.uses_draft for v in variants):
        missing = [p.name for p in pairs if not p.draft]
        if missing:
            raise ConfigError(f"pair(s) {', '.join(missing)} have no draft, needed by "
                              "the speculative strategies")
    try:
        n_predict = int(overrides.get("n_predict", raw.get("n_predict", 128)))
        repeats = int(overrides.get("repeats", raw.get("repeats", 1)))
        timeout = float(overrides.get("timeout", raw.get("timeout", 3600)))
    except ValueError as err:
        raise ConfigError(f"bad number: {err}") from None
    if n_predict < 1 or repeats < 1 or timeout <= 0:
        raise ConfigError("n_predict, repeats and timeout must be positive")
    threads = overrides.get("threads", raw.get("threads", 1))
    if isinstance(threads, str) and threads.isdigit():
        threads = int(threads)
    return Config(path=path, n_predict=n_predict, threads=_threads(threads, "threads"),
                  repeats=repeats, timeout=timeout, extra=_flags(raw.get("extra"), "extra"),
                  variants=variants, pairs=pairs, prompts=prompts,
                  settings=parse_settings(raw["settings"], path))


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
    from pipeinfer import tinymodel
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
