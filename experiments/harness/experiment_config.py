"""The experiment config (TOML) that experiments/run_experiments.py runs: parsing and checks.

All keys but pairs/prompts/settings are optional (examples: experiments/configs/*.toml):

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

import itertools
import os
import re
import shlex
import tomllib
from dataclasses import dataclass, field

from .cpu_quota import MIN_QUOTA_US
from pathlib import Path

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
            period = setting.period_us
            if cpus is not None and period and min(cpus) * period < MIN_QUOTA_US:
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
