#!/bin/bash
# Issue 34, the quarter-core head's draft supply: llama-bench tg32 of the draft (the compact
# Q4_0 copy of Qwen2.5-Coder 0.5B, full vocabulary, and its --draft-vocab 32768 copy) on one
# thread under the same CPU quota as one emulated node (cluster.py --cpu, 10 ms period).
cd "$(dirname "$0")/../../.."
CPU=${CPU:-0.25}
BENCH=~/.cache/pipeinfer/peers/llama.cpp-0.3.36-1b12979f7740f613/bin/llama-bench
for f in "$@"; do
  echo "== $(basename "$f") at $CPU core"
  flock /tmp/cpu.lock .venv/bin/python experiments/cluster.py --nodes 1 --cpu $CPU --period-us 10000 -- \
    $BENCH -m "$f" -t 1 -p 0 -n 32 -r 3 2>&1 | grep -E "^\| (qwen|model)" 
done
