#!/bin/bash
# The chart's K=3: run.sh's first pass (scaling_pass1.csv, the first 15 rows of scaling.csv;
# its later passes ran in a slow spell) and the two of `K=2 TAG=_more bash run.sh`
# (scaling_more.csv), drawn by plot.py: scaling.png and summary.txt (plot.py's means over
# the 3), and medians.txt, the README's table: each system's median and passes per node count.
cd "$(dirname "$0")"
head -16 scaling.csv > scaling_pass1.csv
{ cat scaling_pass1.csv; tail -n +2 scaling_more.csv; } > scaling_k3.csv
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
../../../.venv/bin/python ../../../plot.py scaling_k3.csv --out "$TMP" >/dev/null &&
  cp "$TMP/scaling.png" "$TMP/summary.txt" .
../../../.venv/bin/python - > medians.txt <<'PY'
import csv, statistics
runs = {}
for r in csv.DictReader(open("scaling_k3.csv")):
    runs.setdefault(r["strategy"], {}).setdefault(int(r["ranks"]), []).append(float(r["speed_tps"]))
for system, by_nodes in runs.items():
    med = {n: statistics.median(v) for n, v in by_nodes.items()}
    cells = " | ".join(f"{n}n {med[n]:.2f} ({' / '.join(f'{v:.2f}' for v in by_nodes[n])})"
                       for n in sorted(by_nodes))
    print(f"{system:15s} {cells} | 8 over 2 {med[8] / med[2]:.2f}x")
PY
