#!/bin/bash
# Issue 48's goals 1 and 3 on the final code: the rarely-right draft against iterative
# (4 x 0.5 core, K=5), and 8 x 0.25 core against llama.cpp's RPC setups (K=3).
P="Write a Python LRU cache class with type hints and a usage example."
LB=~/.cache/pipeinfer/peers/llama.cpp-0.3.36-d96a90467eccbfd5/bin/llama-bench
M=~/.cache/pipeinfer/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
B="/work/main/.venv/bin/python /work/main/experiments/bench_peers.py"
cd /work/bench48
$LB -m $M -t 1 -p 0 -n 32 -r 3 2>/dev/null | grep tg32
$B --nodes 4 -n 128 --systems iterative,pipeinfer --prompt "$P" -k 5 \
   --draft /work/draft-first8.gguf --out /work/bench48/final-goal1.csv | grep -v "^  *$"
$LB -m $M -t 1 -p 0 -n 32 -r 3 2>/dev/null | grep tg32
$B --nodes 8 -n 128 -k 3 --draft-max 8 --systems llama-rpc,llama-rpc-spec,pipeinfer \
   --out /work/bench48/final-goal3.csv | grep -v "^  *$"
$LB -m $M -t 1 -p 0 -n 32 -r 3 2>/dev/null | grep tg32
