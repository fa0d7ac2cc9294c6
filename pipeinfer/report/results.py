"""Results CSVs read back: the rows `pipeinfer run --csv` and experiments/run_experiments.py
write, grouped by model pair, prompt, cluster setting and variant, and summarised as the table
plot.py prints (means +- standard deviation over repeats, ratios to iterative).

Rows are grouped by the `label` column that the experiment runner writes
("pair=..;prompt=..;setting=..;variant=.."); rows without such a label are grouped by
target/draft, rank count and strategy.
"""

from __future__ import annotations

import csv
import math
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, replace
from pathlib import Path

from .. import strategies

# Strategies in the main charts (other variants, e.g. "pipeinfer-nocancel", are ablations).
BASE = strategies.NAMES
REQUIRED = ("strategy", "speed_tps", "ttft_s", "itl_s")
ALL_PROMPTS = "(all)"  # the summary's prompt column for the lines over every prompt


class ResultsError(Exception):
    """The file is missing, empty or not a pipeinfer results CSV."""


@dataclass
class Row:
    pair: str
    prompt: str
    setting: str
    variant: str
    strategy: str
    values: dict[str, float | None]


@dataclass
class Metric:
    column: str
    title: str
    unit: str
    scale: float = 1.0
    higher_is_better: bool = True


METRICS = {
    "speed": Metric("speed_tps", "Generation speed", "tokens/s"),
    "ttft": Metric("ttft_s", "Time to first token (TTFT)", "ms", 1000.0, False),
    "itl": Metric("itl_s", "Inter-token latency (ITL)", "ms", 1000.0, False),
    "acceptance": Metric("accept_rate", "Draft acceptance rate", "%", 100.0),
    # Share of the drafted tokens the target did verify that it accepted: differs from
    # accept_rate when runs were cancelled before verification (CSVs since the counters change).
    "verified": Metric("verified_accept_rate", "Acceptance among verified drafted tokens", "%",
                       100.0),
}


def parse_label(label: str) -> dict[str, str]:
    """"a=1;b=2" -> {"a": "1", "b": "2"}; pieces without '=' are ignored."""
    out = {}
    for piece in (label or "").split(";"):
        key, sep, value = piece.partition("=")
        if sep and key.strip():
            out[key.strip()] = value.strip()
    return out


def _float(text: str | None) -> float | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def read_rows(path: Path) -> list[Row]:
    if not path.exists():
        raise ResultsError(f"results file {path} does not exist (run "
                           "experiments/run_experiments.py CONFIG --out FILE first)")
    if path.is_dir():
        raise ResultsError(f"{path} is a directory, not a results CSV")
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        if not reader.fieldnames:
            raise ResultsError(f"results file {path} is empty")
        missing = [c for c in REQUIRED if c not in reader.fieldnames]
        if missing:
            raise ResultsError(f"{path} is not a pipeinfer results CSV (no column(s) "
                               f"{', '.join(missing)})")
        raw = list(reader)
    if not raw:
        raise ResultsError(f"results file {path} has a header but no result rows")
    rows = []
    for r in raw:
        label = parse_label(r.get("label", ""))
        strategy = r.get("strategy") or "?"
        target, draft = r.get("target") or "?", r.get("draft") or ""
        pair = label.get("pair") or (f"{target}+{draft}" if draft else target)
        setting = label.get("setting") or f"{r.get('ranks') or '?'} ranks"
        rows.append(Row(pair=pair, prompt=label.get("prompt", ""), setting=setting,
                        variant=label.get("variant") or strategy, strategy=strategy,
                        values={m.column: _float(r.get(m.column)) for m in METRICS.values()}))
    return rows


def ordered(values) -> list[str]:
    """First-seen order (the order the experiments ran in)."""
    return list(dict.fromkeys(values))


def setting_order(settings) -> list[str]:
    """Settings by their leading node count ("2n-slow" before "4n-none" before "8n-none"),
    settings of one count (and names without one, after those) in first-seen order: rows
    appended by later runs still land in their place on the x axis."""
    def nodes(name: str) -> float:
        digits = name[:len(name) - len(name.lstrip("0123456789"))]
        return int(digits) if digits else math.inf
    return sorted(ordered(settings), key=nodes)


def variant_order(variants) -> list[str]:
    variants = ordered(variants)
    return [v for v in BASE if v in variants] + [v for v in variants if v not in BASE]


def with_values(rows: list[Row], column: str, variants: list[str]) -> list[str]:
    """The variants (in `variants`' order) with at least one value in `column`."""
    return [v for v in variants
            if any(r.variant == v and r.values[column] is not None for r in rows)]


def aggregate(rows: list[Row], column: str):
    """(panel, setting, variant) -> (mean, std, n) over the rows with a value."""
    groups: dict[tuple, list[float]] = defaultdict(list)
    for row in rows:
        value = row.values[column]
        if value is not None:
            groups[(row.pair, row.prompt), row.setting, row.variant].append(value)
    return {k: (statistics.fmean(v), statistics.stdev(v) if len(v) > 1 else 0.0, len(v))
            for k, v in groups.items()}


def summary(rows: list[Row]) -> str:
    """One line per pair, prompt, setting and variant: means +- standard deviation over the
    repeats, and the variant's speed and TTFT as ratios of iterative's (same pair, prompt and
    setting) when the CSV has iterative runs there. A pair with several prompts gets a block
    over all of them (prompt ALL_PROMPTS): every run of the setting and variant counts once.
    The last column, verified acceptance, appears only when the CSV has that column."""
    prompts = defaultdict(set)
    for row in rows:
        prompts[row.pair].add(row.prompt)
    rows = rows + [replace(row, prompt=ALL_PROMPTS) for row in rows if len(prompts[row.pair]) > 1]
    columns = ("speed_tps", "ttft_s", "itl_s", "accept_rate", "verified_accept_rate")
    stats = {column: aggregate(rows, column) for column in columns}
    verified = bool(stats["verified_accept_rate"])
    runs = Counter(((r.pair, r.prompt), r.setting, r.variant) for r in rows)
    lines = [f"{'pair':<18} {'prompt':<10} {'setting':<16} {'variant':<24} {'n':>3} "
             f"{'speed t/s':>13} {'TTFT ms':>15} {'ITL ms':>13} {'accept':>11} "
             f"{'x iter':>7} {'TTFT x iter':>11}" + (f" {'verified':>11}" if verified else "")]
    settings = {s: i for i, s in enumerate(setting_order(r.setting for r in rows))}
    blocks = sorted(ordered(((r.pair, r.prompt), r.setting) for r in rows),
                    key=lambda b: (b[0][1] == ALL_PROMPTS, settings[b[1]]))
    for panel, setting in blocks:
        for variant in variant_order(r.variant for r in rows):
            key = panel, setting, variant
            n = runs[key]
            if not n:
                continue
            line = (f"{panel[0]:<18} {panel[1] or '-':<10} {setting:<16} {variant:<24} {n:>3} "
                    f"{_cell(stats['speed_tps'], key):>13} "
                    f"{_cell(stats['ttft_s'], key, 1000, 0):>15} "
                    f"{_cell(stats['itl_s'], key, 1000, 0):>13} "
                    f"{_cell(stats['accept_rate'], key):>11} "
                    f"{_ratio(stats['speed_tps'], key):>7} {_ratio(stats['ttft_s'], key):>11}")
            if verified:
                line += f" {_cell(stats['verified_accept_rate'], key):>11}"
            lines.append(line)
    return "\n".join(lines)


def _cell(stats: dict, key: tuple, scale: float = 1.0, digits: int = 2) -> str:
    """"mean ±std" of one group (no ± for a single run), "-" without values."""
    if key not in stats:
        return "-"
    mean, std, n = stats[key]
    return f"{mean * scale:.{digits}f}" + (f" ±{std * scale:.{digits}f}" if n > 1 else "")


def _ratio(stats: dict, key: tuple) -> str:
    """The group's mean over iterative's for the same pair, prompt and setting."""
    panel, setting, _ = key
    own, base = stats.get(key), stats.get((panel, setting, strategies.ITERATIVE.name))
    if own is None or base is None or base[0] <= 0:
        return "-"
    return f"{own[0] / base[0]:.2f}"
