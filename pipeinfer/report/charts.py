"""The charts of a results CSV (plot.py draws them): grouped bars per metric, one panel per
model pair and prompt, the cluster settings along the x axis and one bar per strategy
(speed.png, ttft.png, itl.png, acceptance.png, verified_acceptance.png), PipeInfer's
ablations (ablation.png), llama.cpp's peers beside pipeinfer (peers.png) and speed against
nodes (scaling.png); summary.txt holds results.py's table. matplotlib's pyplot is passed in
(`plt`), so the caller picks its backend."""

from __future__ import annotations

import math
import re
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from .. import strategies
from .results import (BASE, METRICS, Metric, Row, ordered, setting_order, summary,
                      variant_order, with_values)


COLORS = {name: strategies.STRATEGIES[name].color for name in strategies.NAMES}
PEER_PREFIX = "llama-"   # experiments/bench_peers.py's llama.cpp rows: peers.png
EXTRA_COLORS = ["#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c", "#ccb974", "#64b5cd"]


def colors_for(variants: list[str]) -> dict[str, str]:
    out, extra = {}, iter(EXTRA_COLORS * 4)
    for v in variants:
        out[v] = COLORS.get(v) or next(extra)
    return out


def panel_title(panel: tuple[str, str]) -> str:
    pair, prompt = panel
    return f"{pair} — prompt: {prompt}" if prompt else pair


def value_labels(ax, pos, means, stds) -> None:
    """The mean above each bar's error bar."""
    digits = 0 if max(means) >= 100 else 1 if max(means) >= 10 else 2
    for x, m, s in zip(pos, means, stds):
        ax.annotate(f"{m:.{digits}f}", (x, m + s), xytext=(0, 2), textcoords="offset points",
                    ha="center", va="bottom", fontsize=7, color="#333333")


@dataclass(frozen=True)
class Bars:
    """What every panel of a bar chart draws: the variants (a bar each, in `colors`), the
    values of each (panel, setting, variant), the metric, and the most settings a panel has."""
    variants: list[str]
    groups: dict
    colors: dict
    metric: Metric
    n_x_max: int


def draw_panel(ax, panel, xs: list[str], bars: Bars) -> None:
    """One panel of bar_chart: a bar per (setting, variant) with its std, values labelled
    unless the widest panel has too many bars for them."""
    variants, groups, colors, metric = bars.variants, bars.groups, bars.colors, bars.metric
    bar_w = 0.8 / len(variants)
    many = bars.n_x_max * len(variants) > 36
    top = 0.0
    for j, variant in enumerate(variants):
        means, stds, pos = [], [], []
        for i, x in enumerate(xs):
            values = groups.get((panel, x, variant))
            if not values:
                continue
            means.append(statistics.fmean(values))
            stds.append(statistics.stdev(values) if len(values) > 1 else 0.0)
            pos.append(i + (j - (len(variants) - 1) / 2) * bar_w)
        if not pos:
            continue
        ax.bar(pos, means, bar_w * 0.92, yerr=stds, capsize=3 if not many else 1.5,
               color=colors[variant], label=variant, edgecolor="white",
               linewidth=0.5, error_kw={"elinewidth": 1, "ecolor": "#333333"})
        top = max(top, max(m + s for m, s in zip(means, stds)))
        if not many:
            value_labels(ax, pos, means, stds)
    ax.set_xticks(range(len(xs)))
    ax.set_xticklabels(xs, rotation=30 if len(xs) > 4 or max(map(len, xs)) > 12 else 0,
                       ha="right" if len(xs) > 4 or max(map(len, xs)) > 12 else "center",
                       fontsize=9)
    ax.set_ylabel(f"{metric.title.split(' (')[0]} ({metric.unit})", fontsize=9)
    ax.set_xlabel("cluster setting", fontsize=9)
    ax.set_title(panel_title(panel), fontsize=10)
    ax.set_ylim(0, top * 1.15 if top > 0 else 1)
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    ax.tick_params(axis="y", labelsize=8)


def bar_chart(plt, rows: list[Row], metric: Metric, variants: list[str], path: Path,
              title: str) -> bool:
    """Grouped bars: one panel per (pair, prompt); x groups = settings; bars = variants."""
    rows = [r for r in rows if r.variant in variants and r.values[metric.column] is not None]
    if not rows:
        return False
    panels = ordered((r.pair, r.prompt) for r in rows)
    groups: dict[tuple, list[float]] = defaultdict(list)
    for r in rows:
        groups[(r.pair, r.prompt), r.setting, r.variant].append(
            r.values[metric.column] * metric.scale)
    variants = [v for v in variants if any(r.variant == v for r in rows)]
    colors = colors_for(variants)
    xs_of = {p: setting_order(r.setting for r in rows if (r.pair, r.prompt) == p)
             for p in panels}
    n_x_max = max(len(xs) for xs in xs_of.values())
    ncols = 1 if n_x_max > 4 or len(panels) == 1 else min(2, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    width_in = max(7.0, min(22.0, 1.2 + n_x_max * (0.35 * len(variants) + 0.5))) \
        if ncols == 1 else 13.0
    fig, axes = plt.subplots(nrows, ncols, figsize=(width_in, 3.9 * nrows + 0.9),
                             squeeze=False)
    bars = Bars(variants, groups, colors, metric, n_x_max)
    for index, panel in enumerate(panels):
        draw_panel(axes[index // ncols][index % ncols], panel, xs_of[panel], bars)
    for index in range(len(panels), nrows * ncols):
        axes[index // ncols][index % ncols].set_visible(False)
    n_runs = max(len(v) for v in groups.values())
    better = "higher is better" if metric.higher_is_better else "lower is better"
    fig.suptitle(f"{title} ({metric.unit}, {better}); mean ± std over "
                 f"{'up to ' if min(len(v) for v in groups.values()) != n_runs else ''}"
                 f"{n_runs} run(s)", fontsize=11)
    seen: dict = {}
    for ax in axes.flat:
        handles, labels = ax.get_legend_handles_labels()
        for handle, label in zip(handles, labels):
            seen.setdefault(label, handle)
    fig.legend([seen[v] for v in variants if v in seen], [v for v in variants if v in seen],
               loc="upper center", ncol=min(len(variants), 5), fontsize=9, frameon=False,
               bbox_to_anchor=(0.5, 1 - 0.45 / fig.get_figheight()))
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.75 / fig.get_figheight()))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def ablation_chart(plt, rows: list[Row], variants: list[str], path: Path) -> bool:
    """Paper Fig. 8: speed and ITL of PipeInfer and its ablation variants, per configuration."""
    rows = [r for r in rows if r.variant in variants]
    if not rows:
        return False
    configs = ordered((r.pair, r.prompt, r.setting) for r in rows)
    by_setting = {s: i for i, s in enumerate(setting_order(r.setting for r in rows))}
    configs.sort(key=lambda c: by_setting[c[2]])
    names = [" / ".join(x for x in c if x) for c in configs]
    colors = colors_for(variants)
    width_in = max(8.0, min(22.0, 2.0 + len(configs) * (0.45 * len(variants) + 0.6)))
    fig, axes = plt.subplots(1, 2, figsize=(width_in, 4.8), squeeze=False)
    bar_w = 0.8 / len(variants)
    for ax, key in zip(axes[0], ("speed", "itl")):
        metric = METRICS[key]
        top = 0.0
        for j, variant in enumerate(variants):
            means, stds, pos = [], [], []
            for i, config in enumerate(configs):
                values = [r.values[metric.column] * metric.scale for r in rows
                          if (r.pair, r.prompt, r.setting) == config and r.variant == variant
                          and r.values[metric.column] is not None]
                if values:
                    means.append(statistics.fmean(values))
                    stds.append(statistics.stdev(values) if len(values) > 1 else 0.0)
                    pos.append(i + (j - (len(variants) - 1) / 2) * bar_w)
            if pos:
                ax.bar(pos, means, bar_w * 0.92, yerr=stds, capsize=3,
                              color=colors[variant], label=variant, edgecolor="white",
                              error_kw={"elinewidth": 1, "ecolor": "#333333"})
                value_labels(ax, pos, means, stds)
                top = max(top, max(m + s for m, s in zip(means, stds)))
        ax.set_xticks(range(len(configs)))
        rotate = len(configs) > 3 or max(map(len, names)) > 20
        ax.set_xticklabels(names, rotation=25 if rotate else 0, ha="right" if rotate else "center",
                           fontsize=8)
        better = "higher is better" if metric.higher_is_better else "lower is better"
        ax.set_title(f"{metric.title} ({better})", fontsize=10)
        ax.set_ylabel(f"{metric.title.split(' (')[0]} ({metric.unit})", fontsize=9)
        ax.set_ylim(0, top * 1.18 if top > 0 else 1)
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.suptitle("PipeInfer ablations (mean ± std over repeated runs)", fontsize=11)
    fig.legend(handles, labels, loc="upper center", ncol=min(len(labels), 4), fontsize=9,
               frameon=False, bbox_to_anchor=(0.5, 1 - 0.45 / fig.get_figheight()))
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.75 / fig.get_figheight()))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


SETTING = re.compile(r"^(\d+)n-([\d.]+)c")   # bench_runs.RunSpec.setting: nodes, cores each


def scaling_series(rows: list[Row]) -> tuple[str | None, dict[str, dict[int, float]]]:
    """The CPU per node with the most node counts, and per system {nodes: median t/s} there
    (a system with several variants, llama.cpp's speculative decoding per draft max: its
    best at each node count)."""
    speeds = defaultdict(lambda: defaultdict(list))   # cpu -> (variant, nodes) -> t/s
    for r in rows:
        m, tps = SETTING.match(r.setting), r.values.get("speed_tps")
        if m and tps:
            speeds[m.group(2)][r.variant, int(m.group(1))].append(tps)
    if not speeds:
        return None, {}
    cpu = max(speeds, key=lambda c: len({n for _, n in speeds[c]}))
    series = defaultdict(dict)
    for (variant, nodes), values in speeds[cpu].items():
        system = re.sub(r"-d\d+$", "", variant)
        series[system][nodes] = max(series[system].get(nodes, 0.0), statistics.median(values))
    return cpu, dict(series)


def scaling_chart(plt, rows: list[Row], path: Path) -> bool:
    """scaling.png: t/s against the number of nodes at a fixed CPU per node (bench_peers
    --cpu-per-node), one line per system; False if the CSV has fewer than 3 node counts."""
    cpu, series = scaling_series(rows)
    if cpu is None or len({n for s in series.values() for n in s}) < 3:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colors = colors_for(list(series))
    for system, points in series.items():
        nodes = sorted(points)
        ax.plot(nodes, [points[n] for n in nodes], marker="o", label=system,
                color=colors[system])
    ax.set_xticks(sorted({n for points in series.values() for n in points}))
    ax.set_xlabel(f"nodes ({cpu} core each)")
    ax.set_ylabel("tokens/s")
    ax.set_title("Speed as nodes are added")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def csv_charts(plt, rows: list[Row], out: Path, csv_name: str) -> list[Path]:
    """The charts of a results CSV (and summary.txt, whose table is also printed)."""
    variants = variant_order(r.variant for r in rows)
    base = [v for v in variants if v in BASE]
    peers = [v for v in variants if v.startswith(PEER_PREFIX)]
    ablations = [v for v in variants if v not in BASE and v not in peers]
    main_variants = base or variants
    written = []
    for key in ("speed", "ttft", "itl"):
        metric = METRICS[key]
        path = out / f"{key}.png"
        if not bar_chart(plt, rows, metric, main_variants, path, metric.title):
            # no value at all for the metric: still write the chart, saying so
            fig, ax = plt.subplots(figsize=(6, 2))
            ax.axis("off")
            ax.text(0.5, 0.5, f"{metric.title}: no values in {csv_name}", ha="center",
                    va="center")
            fig.savefig(path, dpi=110)
            plt.close(fig)
        written.append(path)
    if peers and bar_chart(plt, rows, METRICS["speed"], peers + base, out / "peers.png",
                           "pipeinfer and llama.cpp RPC: generation speed"):
        written.append(out / "peers.png")
    if scaling_chart(plt, rows, out / "scaling.png"):
        written.append(out / "scaling.png")
    if ablations:
        abl = (["pipeinfer"] if "pipeinfer" in variants else []) + ablations
        if ablation_chart(plt, rows, abl, out / "ablation.png"):
            written.append(out / "ablation.png")
    for key, name in (("acceptance", "acceptance"), ("verified", "verified_acceptance")):
        metric = METRICS[key]
        speculating = with_values(rows, metric.column, variants)
        if speculating and bar_chart(plt, rows, metric, speculating, out / f"{name}.png",
                                     metric.title):
            written.append(out / f"{name}.png")
    table = summary(rows)
    (out / "summary.txt").write_text(table + "\n")
    print(table)
    return written
