#!/bin/bash
# Issue 34 on this host (2026-11-26, fourth session), each step under the CPU lock:
# 1. the issue's 8-node point: even split, head without target layers, -n 128, K=3
# 2. the quarter-core scaling mode, pipeinfer only: 2 nodes K=3 (the ratio's base),
#    3, 4, 6 nodes K=1 (8 nodes x 0.25 is step 1's point)
cd "$(dirname "$0")/../../.."
OUT=experiments/reference/hop-2026-11-26e
flock /tmp/cpu.lock .venv/bin/python experiments/bench_peers.py --nodes 8 -n 128 -k 3 \
    --systems llama-rpc,iterative,pipeinfer --out $OUT/nodes8.csv > $OUT/nodes8.txt 2>&1
flock /tmp/cpu.lock .venv/bin/python experiments/bench_peers.py --nodes 2 --cpu-per-node 0.25 \
    -n 128 -k 3 --systems pipeinfer --out $OUT/scaling.csv > $OUT/scaling2.txt 2>&1
flock /tmp/cpu.lock .venv/bin/python experiments/bench_peers.py --nodes 3,4,6 --cpu-per-node 0.25 \
    -n 128 -k 1 --systems pipeinfer --out $OUT/scaling.csv > $OUT/scaling346.txt 2>&1
