#!/bin/bash
# Issue 34, the 4-node point at the issue's protocol with the default flags of the fifth
# session (pipeinfer: --draft-vocab auto = 32768 at 4 ranks), under the CPU lock.
cd "$(dirname "$0")/../../.."
OUT=experiments/reference/hop-2026-11-26f
flock /tmp/cpu.lock .venv/bin/python experiments/bench_peers.py --nodes 4 -n 128 -k 3 \
    --systems llama-rpc,llama-rpc-spec,iterative,pipeinfer --out $OUT/nodes4.csv > $OUT/nodes4.txt 2>&1
# and the 8-node point (the same systems as the fourth session's bench.sh)
flock /tmp/cpu.lock .venv/bin/python experiments/bench_peers.py --nodes 8 -n 128 -k 3 \
    --systems llama-rpc,iterative,pipeinfer --out $OUT/nodes8.csv > $OUT/nodes8.txt 2>&1
# and the scaling mode's base: 2 quarter-core nodes (8 x 0.25 is the point above)
flock /tmp/cpu.lock .venv/bin/python experiments/bench_peers.py --nodes 2 --cpu-per-node 0.25 \
    -n 128 -k 3 --systems pipeinfer --out $OUT/scaling.csv > $OUT/scaling2.txt 2>&1
