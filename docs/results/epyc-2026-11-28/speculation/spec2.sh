#!/bin/bash
# Issue 48's rarely-right draft on the final code (K=5, interleaved)
cd /work/bench58/spec
LB=~/.cache/pipeinfer/peers/llama.cpp-0.3.36-d96a90467eccbfd5/bin/llama-bench
M=~/.cache/pipeinfer/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
PY=/work/main/.venv/bin/python
P="Write a Python LRU cache class with type hints and a usage example."
date
$LB -m $M -t 1 -p 0 -n 32 -r 3 2>/dev/null | grep tg32
$PY /work/main/experiments/bench_peers.py --nodes 4 -n 128 -k 5 --systems iterative,pipeinfer --prompt "$P" --draft /work/bench58/spec/first8.gguf --out goal1.csv
$LB -m $M -t 1 -p 0 -n 32 -r 3 2>/dev/null | grep tg32
date
