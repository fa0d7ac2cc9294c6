#!/bin/bash
# The simulator against real runs in the quarter-core scaling mode (issue 34), now that
# `simulate` models the draft run drafts with (--draft-vocab auto: the 32768-token copy for
# pipeinfer on 4 nodes or more). pipeinfer on 2, 4 and 8 nodes of a quarter core, -n 128:
# simulated with --draft-vocab auto and 0 (its own acceptance probe), then measured
# (bench_peers.py, default flags, K passes interleaved), under the CPU lock, the host's
# llama-bench figure (1 thread, and under one node's quota) first and last.
cd "$(dirname "$0")/../../.."
OUT=experiments/reference/validate-2026-11-27
BENCH=$(.venv/bin/python experiments/build_peers.py --where)/llama-bench  # this CPU's build (CMAKE_ARGS)
TARGET=~/.cache/pipeinfer/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
hostfig() { flock /tmp/cpu.lock $BENCH -m $TARGET -t 1 -p 0 -n 32 -r 3 2>&1 | grep -E 'tg32'
  flock /tmp/cpu.lock .venv/bin/python experiments/cluster.py --nodes 1 --cpu 0.25 --period-us 10000 -- \
    $BENCH -m $TARGET -t 1 -p 0 -n 16 -r 1 2>&1 | grep -E 'tg16'; }
K=${K:-3}
{ date; hostfig; } > $OUT/llama-bench.txt
for n in 2 4 8; do
  for vocab in auto 0; do
    flock /tmp/cpu.lock .venv/bin/pipeinfer simulate -m qwen-coder-1.5b -md qwen-coder-0.5b \
        --nodes $n --cpu 0.25 -n 128 --strategy pipeinfer --draft-vocab $vocab --json -q | tail -1 | \
      .venv/bin/python -c "import json,sys; r=json.load(sys.stdin); print('$n nodes, --draft-vocab $vocab:', round(r['speed_tps'], 2), 't/s, K', r['draft_vocab'], 'draft', r['draft_ms'], 'ms/token, acceptance', r['assumed_accept_rate'])"
  done
done > $OUT/simulated.txt
flock /tmp/cpu.lock .venv/bin/python experiments/bench_peers.py --nodes 2,4,8 --cpu-per-node 0.25 \
    -n 128 -k $K --systems pipeinfer --out $OUT/measured.csv > $OUT/measured.txt 2>&1
{ date; hostfig; } >> $OUT/llama-bench.txt
