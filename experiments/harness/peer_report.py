"""bench_peers.py's results as the results pages show them: a Markdown table of medians and
ratios, a chart (grouped bars per node count, or t/s against nodes when every node has the same
CPU), and with --memory each node's peak resident memory per system. Read back from the CSV
bench_peers writes, so a page's table and chart are redrawn from its data (`--replot`)."""

from __future__ import annotations

import csv
import re
import statistics
from collections import defaultdict
from pathlib import Path

SETTING = re.compile(r"^(\d+)n-([\d.]+)c")
NAMES = {"llama-rpc": "llama.cpp RPC", "llama-rpc-spec": "RPC + its spec (best)",
         "iterative": "pipeinfer iterative", "speculative": "pipeinfer speculative",
         "pipeinfer": "pipeinfer", "pipeinfer-default-split": "pipeinfer, default split"}
ORDER = list(NAMES)


def load(path: Path) -> dict:
    """{(nodes, variant): [run dicts: speed_tps, peak_rss_mb (list), error, cpu]} in file order."""
    results = defaultdict(list)
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            label = dict(p.split("=", 1) for p in row.get("label", "").split(";") if "=" in p)
            m = SETTING.match(label.get("setting", ""))
            rss = [float(x) for x in (row.get("peak_rss_mb") or "").split(",") if x]
            results[int(row["ranks"]), label.get("variant", row["strategy"])].append(
                {"speed_tps": float(row["speed_tps"]) if row.get("speed_tps") else None,
                 "peak_rss_mb": rss, "error": row.get("error", ""),
                 "cpu": m.group(2) if m else ""})
    return dict(results)


def medians(results: dict) -> dict:
    """{nodes: {system: (median t/s, [per run], variant)}}; llama.cpp's speculative decoding
    at its best --draft-max per node count."""
    out = defaultdict(dict)
    for (nodes, variant), runs in results.items():
        speeds = [r["speed_tps"] for r in runs if r["speed_tps"]]
        if not speeds:
            continue
        system = re.sub(r"-d\d+$", "", variant)
        entry = (statistics.median(speeds), speeds, variant)
        if system not in out[nodes] or entry[0] > out[nodes][system][0]:
            out[nodes][system] = entry
    return {n: out[n] for n in sorted(out)}


def _systems(table: dict) -> list[str]:
    seen = {s for row in table.values() for s in row}
    return [s for s in ORDER if s in seen] + sorted(seen - set(ORDER))


def _cell(entry) -> str:
    if entry is None:
        return "-"
    tps, runs, variant = entry
    draft = re.search(r"-d(\d+)$", variant)
    return (f"{tps:.2f} ({' / '.join(f'{r:.2f}' for r in runs)})"
            + (f" d{draft.group(1)}" if draft else ""))


def speed_table(results: dict) -> str:
    """Markdown: a row per node count, median t/s per system (runs in brackets), pipeinfer
    over the best llama.cpp configuration and iterative over plain RPC."""
    table = medians(results)
    systems = _systems(table)
    cpu = {n: next(r["cpu"] for (k, _), runs in results.items() if k == n for r in runs)
           for n in table}
    head = ["nodes"] + [NAMES.get(s, s) for s in systems] + ["pipeinfer / best peer",
                                                             "iterative / RPC"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for nodes, row in table.items():
        peers = [row[s][0] for s in row if s.startswith("llama-rpc")]
        pipe, it, rpc = (row.get(s, (None,))[0] for s in ("pipeinfer", "iterative", "llama-rpc"))
        ratio = f"**{pipe / max(peers):.2f}x**" if pipe and peers else "-"
        it_ratio = f"{it / rpc:.2f}x" if it and rpc else "-"
        lines.append(f"| {nodes} x {cpu[nodes]} core | "
                     + " | ".join(_cell(row.get(s)) for s in systems)
                     + f" | {ratio} | {it_ratio} |")
    return "\n".join(lines) + "\n"


def scaling_table(results: dict) -> str:
    """Markdown: a row per system, its median t/s at every node count and the most nodes over
    the fewest."""
    table = medians(results)
    counts = list(table)
    lines = ["| system | " + " | ".join(f"{n} nodes" for n in counts)
             + f" | {counts[-1]} over {counts[0]} |", "|---|" + "---|" * (len(counts) + 1)]
    for system in _systems(table):
        entries = [table[n].get(system) for n in counts]
        first, last = entries[0], entries[-1]
        gain = f"**{last[0] / first[0]:.2f}x**" if first and last else "-"
        lines.append(f"| {NAMES.get(system, system)} | "
                     + " | ".join(_cell(e) for e in entries) + f" | {gain} |")
    return "\n".join(lines) + "\n"


def is_scaling(results: dict) -> bool:
    """Every node the same CPU whatever their number (--cpu-per-node), 3 node counts or more."""
    cpus = {r["cpu"] for runs in results.values() for r in runs}
    return len(cpus) == 1 and len({n for n, _ in results}) >= 3


def memory_table(results: dict) -> str:
    """Markdown: per node count and system, each node's median peak RSS in MB."""
    lines = ["| nodes | system | peak RSS per node, MB (node 0 first) |", "|---|---|---|"]
    for (nodes, variant), runs in sorted(results.items(), key=lambda kv: kv[0][0]):
        per_node = [r["peak_rss_mb"] for r in runs if r["peak_rss_mb"]]
        if per_node:
            cells = [statistics.median(v) for v in zip(*per_node)]
            lines.append(f"| {nodes} | {NAMES.get(variant, variant)} | "
                         + " / ".join(f"{c:.0f}" for c in cells) + " |")
    return "\n".join(lines) + "\n"
