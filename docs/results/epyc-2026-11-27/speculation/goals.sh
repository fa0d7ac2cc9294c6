#!/bin/bash
# Issue 48's first two goals on this host: a rarely-right draft (the 0.5B's first 8 layers)
# and the matched 0.5B draft, LRU-cache prompt, 4 x 0.5 core, 128 tokens, pipeinfer with its
# defaults against iterative, interleaved.
P="Write a Python LRU cache class with type hints and a usage example."
LB=~/.cache/pipeinfer/peers/llama.cpp-0.3.36-d96a90467eccbfd5/bin/llama-bench
M=~/.cache/pipeinfer/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
B="/work/main/.venv/bin/python /work/main/experiments/bench_peers.py --nodes 4 -n 128 --systems iterative,pipeinfer --prompt"
cd /work/bench48
$LB -m $M -t 1 -p 0 -n 32 -r 3 2>/dev/null | grep tg32
$B "$P" -k 5 --draft /work/draft-first8.gguf --out /work/bench48/goal1b.csv | grep -v "^  *$"
$LB -m $M -t 1 -p 0 -n 32 -r 3 2>/dev/null | grep tg32
$B "$P" -k 3 --out /work/bench48/goal2b.csv | grep -v "^  *$"
$LB -m $M -t 1 -p 0 -n 32 -r 3 2>/dev/null | grep tg32
