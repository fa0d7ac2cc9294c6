#!/bin/bash
# The chart's K=3: run.sh's first pass (scaling_pass1.csv, the first 15 rows of scaling.csv;
# its later passes ran in a slow spell) and the two of `K=2 TAG=_more bash run.sh`
# (scaling_more.csv), drawn by plot.py: scaling.png and summary.txt (medians over the 3).
cd "$(dirname "$0")"
head -16 scaling.csv > scaling_pass1.csv
{ cat scaling_pass1.csv; tail -n +2 scaling_more.csv; } > scaling_k3.csv
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
../../../.venv/bin/python ../../../plot.py scaling_k3.csv --out "$TMP" >/dev/null &&
  cp "$TMP/scaling.png" "$TMP/summary.txt" .
