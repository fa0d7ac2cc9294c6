#!/bin/bash
# Issue 34's scaling chart with every system it names: llama.cpp RPC, RPC with its speculative
# decoding (--draft-max 8, its best at 4 and 8 nodes in the peers run), pipeinfer iterative,
# speculative and pipeinfer (default flags), on 2, 4 and 8 nodes of a quarter core each (3 and
# 6 left out for time: pipeinfer's are in ../scaling-2026-11-26b), 64 tokens, K (default 3)
# passes interleaved, under the CPU lock; the host's llama-bench figure first and last. TAG
# names another set of files (the eighth session's `K=2 TAG=_more bash run.sh`, after a pass
# of this one and a slow spell: README.md there).
cd "$(dirname "$0")/../../.."
OUT=experiments/reference/scaling-2026-11-26c
BENCH=~/.cache/pipeinfer/peers/llama.cpp-0.3.36-1b12979f7740f613/bin/llama-bench
TARGET=~/.cache/pipeinfer/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
# The host, and the same under one node's quota: the second should be about a quarter of the
# first (on this shared VM it fell to a twelfth for a while in the seventh session).
hostfig() { flock /tmp/cpu.lock $BENCH -m $TARGET -t 1 -p 0 -n 32 -r 3 2>&1 | grep -E 'tg32'
  flock /tmp/cpu.lock .venv/bin/python experiments/cluster.py --nodes 1 --cpu 0.25 --period-us 10000 -- \
    $BENCH -m $TARGET -t 1 -p 0 -n 16 -r 1 2>&1 | grep -E 'tg16'; }
K=${K:-3}; TAG=${TAG:-}
{ date; hostfig; } >> $OUT/llama-bench$TAG.txt
flock /tmp/cpu.lock .venv/bin/python experiments/bench_peers.py --nodes 2,4,8 --cpu-per-node 0.25 \
    -n 64 -k $K --draft-max 8 --out $OUT/scaling$TAG.csv > $OUT/scaling$TAG.txt 2>&1
{ date; hostfig; } >> $OUT/llama-bench$TAG.txt
