#!/bin/bash
# Issue 34, quarter-core scaling: the most 8 nodes can give when the head's quarter core drafts
# every token, measured in one run. The head's draft model must decode every token it drafts,
# one at a time (a guess needs the one before it), so a run takes at least n_drafted x (one
# draft decode on a quarter core), and at least (tokens generated) x that if every guess were
# right. Measures, under the CPU lock: llama-bench tg16 under one node's quota of the file the
# head drafts with at 8 nodes (the 32768-token copy of the compact 0.5B) and of the target,
# K times interleaved; then pipeinfer at 2 and 8 quarter-core nodes (bench_peers.py, default
# flags, K passes); bound.py prints the bounds against the 2-node figure.
cd "$(dirname "$0")/../../.."
OUT=experiments/reference/bound-2026-11-27
BENCH=$(.venv/bin/python experiments/build_peers.py --where)/llama-bench  # this CPU's build (CMAKE_ARGS)
TARGET=~/.cache/pipeinfer/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
DRAFT=$(ls ~/.cache/pipeinfer/draft-vocab/*-k32768-v1.gguf | head -1)
K=${K:-3}
quota() { flock /tmp/cpu.lock .venv/bin/python experiments/cluster.py --nodes 1 --cpu 0.25 \
    --period-us 10000 -- $BENCH -m "$1" -t 1 -p 0 -n 16 -r 1 2>&1 | grep -E 'tg16' | sed "s|^|$2 |"; }
{ date; echo "host: $(flock /tmp/cpu.lock $BENCH -m $TARGET -t 1 -p 0 -n 32 -r 3 2>&1 | grep tg32)"
  for i in $(seq $K); do quota "$DRAFT" draft; quota $TARGET target; done; } > $OUT/llama-bench.txt
flock /tmp/cpu.lock .venv/bin/python experiments/bench_peers.py --nodes 2,8 --cpu-per-node 0.25 \
    -n 128 -k $K --systems pipeinfer --out $OUT/runs.csv > $OUT/runs.txt 2>&1
{ date; echo "host: $(flock /tmp/cpu.lock $BENCH -m $TARGET -t 1 -p 0 -n 32 -r 3 2>&1 | grep tg32)"; } >> $OUT/llama-bench.txt
.venv/bin/python $OUT/bound.py $OUT/runs.csv $OUT/llama-bench.txt | tee $OUT/bound.txt
