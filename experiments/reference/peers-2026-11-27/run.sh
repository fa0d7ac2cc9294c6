#!/bin/bash
# Issue 34's per-hop and speculation goals on this host: llama.cpp RPC, RPC with its
# speculative decoding (--draft-max 8, its best at 4 and 8 nodes before), pipeinfer iterative
# and pipeinfer, on 4 x 0.5 and 8 x 0.25 core (the machine's 2 cores shared), -n 128, K=3
# interleaved, under the CPU lock; the host's llama-bench figure first and last.
cd "$(dirname "$0")/../../.."
OUT=experiments/reference/peers-2026-11-27
BENCH=$(.venv/bin/python experiments/build_peers.py --where)/llama-bench  # this CPU's build (CMAKE_ARGS)
TARGET=~/.cache/pipeinfer/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
hostfig() { flock /tmp/cpu.lock $BENCH -m $TARGET -t 1 -p 0 -n 32 -r 3 2>&1 | grep -E 'tg32'; }
{ date; hostfig; } > $OUT/llama-bench.txt
flock /tmp/cpu.lock .venv/bin/python experiments/bench_peers.py --nodes 4,8 -n 128 -k 3 \
    --draft-max 8 --systems llama-rpc,llama-rpc-spec,iterative,pipeinfer \
    --out $OUT/peers.csv > $OUT/peers.txt 2>&1
{ date; hostfig; } >> $OUT/llama-bench.txt
