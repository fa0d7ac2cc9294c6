#!/usr/bin/env python3
"""Turn a pipeinfer results CSV into PNG charts (PipeInfer paper, Figs. 4-8), and a trace into
a pipeline timeline (Figs. 2-3).

    python plot.py results.csv --out figures/ [--show]
    python plot.py --timeline trace.jsonl --out figures/

Writes speed.png (generation speed), ttft.png (time to first token), itl.png (inter-token
latency): grouped bars, one panel per model pair and prompt, the cluster settings along the x
axis (by node count, then in the order they first appear) and one bar per strategy, the mean
over repeated runs with the standard deviation as the error bar. ablation.png when the CSV
holds PipeInfer ablation variants (paper Fig. 8), peers.png when it holds llama.cpp rows of
experiments/bench_peers.py (speed per system and node count), scaling.png when those rows
have three or more node counts at one CPU per node (bench_peers --cpu-per-node: t/s against
nodes, a line per system), acceptance.png when it holds acceptance
rates, verified_acceptance.png when it holds verified acceptance rates (the share of the
drafted tokens the target did verify that it accepted). summary.txt holds the table that is
also printed (pipeinfer/report/results.py): means +- standard deviation over the repeats, and speed
and TTFT as ratios of iterative's; a pair run on several prompts also gets lines for all its
prompts together (prompt "(all)").

--timeline TRACE (a `pipeinfer run --trace` file) writes timeline.png: one row per rank, a bar
per run on each, coloured by kind, cancelled runs marked, the accepted tokens on the head's
row (pipeinfer/report/timeline.py). A CSV is then optional.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

from pipeinfer.report.charts import csv_charts
from pipeinfer.report.results import ResultsError, Row, read_rows
from pipeinfer.report.timeline import Trace, TraceError, draw_timeline, read_trace


def read_inputs(args) -> tuple[list[Row] | None, Trace | None]:
    """The CSV's rows and the trace, each None when not asked for (errors propagate)."""
    rows = read_rows(Path(args.csv)) if args.csv else None
    try:
        trace = read_trace(Path(args.timeline)) if args.timeline else None
    except TraceError as err:  # name the file: the message names only the line
        raise TraceError(None, f"{args.timeline}: {err}") from None
    return rows, trace


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("csv", nargs="?", help="results CSV written by pipeinfer run --csv")
    parser.add_argument("--timeline", metavar="TRACE",
                        help="trace written by pipeinfer run --trace: draw timeline.png")
    parser.add_argument("--out", default="figures", help="directory for the PNG files")
    parser.add_argument("--show", action="store_true", help="also open the charts in a window")
    args = parser.parse_args(argv)
    if args.csv is None and args.timeline is None:
        parser.error("give a results CSV, --timeline TRACE, or both")

    try:
        rows, trace = read_inputs(args)
    except (ResultsError, TraceError, OSError, csv.Error, UnicodeDecodeError) as err:
        print(f"plot.py: error: {err}", file=sys.stderr)
        return 2

    import matplotlib
    if not args.show:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    written = csv_charts(plt, rows, out, args.csv) if rows is not None else []
    if trace is not None:
        draw_timeline(trace, out / "timeline.png")
        written.append(out / "timeline.png")
    for path in written + ([out / "summary.txt"] if rows is not None else []):
        print(f"wrote {path}")
    if args.show:
        for path in written:
            fig = plt.figure(figsize=(10, 6))
            fig.figimage(plt.imread(path))
        plt.show()
    return 0


if __name__ == "__main__":
    sys.exit(main())
