#!/bin/bash
# Matched 0.5B draft, LRU prompt, 4 x 0.5 core, 128 tokens: pipeinfer before (wt-b: 8c5806b
# plus the CPU accounting only) and after (main), and iterative (main), interleaved, K=3.
P="Write a Python LRU cache class with type hints and a usage example."
LB=~/.cache/pipeinfer/peers/llama.cpp-0.3.36-d96a90467eccbfd5/bin/llama-bench
M=~/.cache/pipeinfer/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
cd /work/bench48
$LB -m $M -t 1 -p 0 -n 32 -r 3 2>/dev/null | grep tg32
for rep in 1 2 3; do
  /work/main/.venv/bin/python /work/main/experiments/bench_peers.py --nodes 4 -n 128 -k 1 \
    --systems iterative,pipeinfer --prompt "$P" --out /work/bench48/ab-new.csv \
    | grep "^# rep" | sed "s/^# rep 0/# new rep $rep/"
  /work/wt-b/.venv/bin/python /work/main/experiments/bench_peers.py --nodes 4 -n 128 -k 1 \
    --systems pipeinfer --prompt "$P" --out /work/bench48/ab-old.csv \
    | grep "^# rep" | sed "s/^# rep 0/# old rep $rep/"
done
$LB -m $M -t 1 -p 0 -n 32 -r 3 2>/dev/null | grep tg32
