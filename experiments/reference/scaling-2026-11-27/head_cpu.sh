#!/bin/bash
# Issue 34, quarter-core scaling: is the head's draft supply what holds pipeinfer back, measured
# rather than simulated? 6 nodes of a quarter core (the head drafting, 5 workers with the
# target's layers even), against the same with the head given 0.75 core (3x the draft supply,
# the 2 cores of this machine in all; 8 nodes leave no core to spare). Interleaved K=3, the
# bench_peers coding prompt, -n 128, default flags, under the CPU lock; then the simulator's
# figures for both (same nodes, its own acceptance probe).
cd "$(dirname "$0")/../../.."
NODES=6; source experiments/reference/hop-2026-11-26e/arms.sh
q5=0.25,0.25,0.25,0.25,0.25
for rep in 1 2 3; do
  CPUS=0.25,$q5 run ""
  CPUS=0.75,$q5 run ""
done
for cpus in 0.25,$q5 0.75,$q5; do
  flock /tmp/cpu.lock .venv/bin/pipeinfer simulate -m qwen-coder-1.5b -md qwen-coder-0.5b \
      --cpus $cpus -n 128 --json -q | tail -1 | \
    .venv/bin/python -c "import json,sys; r=json.load(sys.stdin); print('simulated --cpus $cpus:', round(r['speed_tps'], 2), 't/s')"
done
