"""The charts of the results pages, drawn from the benchmarks' data (matplotlib, PNG): the
head-to-head bars and the scaling lines of bench_peers, each node's memory against llama.cpp's
rpc-server, and the tokens per second of failover's clients across a kill."""

from __future__ import annotations

import statistics
from pathlib import Path

from .peer_report import NAMES, _systems, medians

COLORS = {"llama-rpc": "#c44e52", "llama-rpc-spec": "#8172b3", "iterative": "#4c72b0",
          "speculative": "#dd8452", "pipeinfer": "#55a868", "pipeinfer-default-split": "#937860"}


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _save(fig, ax, path: Path) -> None:
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def peers_chart(results: dict, path: Path, title: str) -> None:
    """Grouped bars: per node count, each system's median t/s, the runs as dots."""
    plt, table = _pyplot(), medians(results)
    systems, counts = _systems(table), list(table)
    width = 0.8 / len(systems)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, system in enumerate(systems):
        xs = [c + (i - (len(systems) - 1) / 2) * width for c in range(len(counts))]
        entries = [table[n].get(system) for n in counts]
        ax.bar(xs, [e[0] if e else 0 for e in entries], width, label=NAMES.get(system, system),
               color=COLORS.get(system))
        for x, e in zip(xs, entries):
            if e:
                ax.plot([x] * len(e[1]), e[1], "k.", ms=3)
    cpu = {n: next(r["cpu"] for (k, _), runs in results.items() if k == n for r in runs)
           for n in counts}
    ax.set_xticks(range(len(counts)), [f"{n} x {cpu[n]} core" for n in counts])
    ax.set_ylabel("tokens/s (median, runs as dots)")
    ax.set_title(title)
    _save(fig, ax, path)
    plt.close(fig)


def scaling_chart(results: dict, path: Path, title: str) -> None:
    """t/s against the number of nodes, a line per system."""
    plt, table = _pyplot(), medians(results)
    counts = list(table)
    cpu = next(r["cpu"] for runs in results.values() for r in runs)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for system in _systems(table):
        points = [(n, table[n][system][0]) for n in counts if system in table[n]]
        ax.plot(*zip(*points), marker="o", label=NAMES.get(system, system),
                color=COLORS.get(system))
    ax.set_xticks(counts)
    ax.set_xlabel(f"nodes ({cpu} core each)")
    ax.set_ylabel("tokens/s (median)")
    ax.set_title(title)
    _save(fig, ax, path)
    plt.close(fig)


def memory_chart(results: dict, path: Path, title: str) -> None:
    """Per node count, each node's median peak RSS per system, side by side."""
    plt = _pyplot()
    counts = sorted({n for n, _ in results})
    fig, axes = plt.subplots(1, len(counts), figsize=(5 * len(counts), 4), squeeze=False)
    for ax, nodes in zip(axes[0], counts):
        variants = [v for n, v in results if n == nodes]
        width = 0.8 / len(variants)
        for i, variant in enumerate(variants):
            per_node = [r["peak_rss_mb"] for r in results[nodes, variant] if r["peak_rss_mb"]]
            cells = [statistics.median(v) for v in zip(*per_node)]
            xs = [k + (i - (len(variants) - 1) / 2) * width for k in range(len(cells))]
            ax.bar(xs, cells, width, label=NAMES.get(variant, variant), color=COLORS.get(variant))
        ax.set_xticks(range(nodes), [f"node {k}" for k in range(nodes)], fontsize=8)
        ax.set_ylabel("peak resident memory, MB")
        ax.set_title(f"{nodes} nodes")
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def failover_chart(streams: dict[int, list[float]], kill_s: float, path: Path,
                   title: str, bin_s: float = 1.0) -> None:
    """Tokens per second of each client's stream (its token arrival times, seconds from the
    start) in bins of `bin_s`, the kill marked."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    end = max((t[-1] for t in streams.values() if t), default=1.0)
    bins = [i * bin_s for i in range(int(end / bin_s) + 2)]
    for client, times in sorted(streams.items()):
        counts = [0] * (len(bins) - 1)
        for t in times:
            counts[min(int(t / bin_s), len(counts) - 1)] += 1
        ax.step(bins[:-1], [c / bin_s for c in counts], where="post", label=f"client {client}")
    ax.axvline(kill_s, color="k", ls="--", lw=1, label="worker killed")
    ax.set_xlabel("seconds since the clients started")
    ax.set_ylabel("tokens/s")
    ax.set_title(title)
    _save(fig, ax, path)
    plt.close(fig)
