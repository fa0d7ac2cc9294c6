#!/bin/bash
# Issue 34's scaling mode with the default flags (--draft-vocab auto since the fifth session):
# pipeinfer on 2, 3, 4, 6 and 8 nodes of a quarter core each, 128 tokens, K=3 interleaved,
# under the CPU lock; plot.py draws scaling.png from the CSV.
cd "$(dirname "$0")/../../.."
OUT=experiments/reference/scaling-2026-11-26b
flock /tmp/cpu.lock .venv/bin/python experiments/bench_peers.py --nodes 2,3,4,6,8 --cpu-per-node 0.25 \
    -n 128 -k 3 --systems pipeinfer --out $OUT/scaling.csv > $OUT/scaling.txt 2>&1
