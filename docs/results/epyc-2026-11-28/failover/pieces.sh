#!/bin/bash
# Issue 49 on the final code: what keeping costs (K=5 interleaved), then a lost host and a
# killed worker (K=3), the host named by llama-bench around each
cd /work/main
LB=~/.cache/pipeinfer/peers/llama.cpp-0.3.36-d96a90467eccbfd5/bin/llama-bench
M=~/.cache/pipeinfer/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
date
$LB -m $M -t 1 -p 0 -n 32 -r 3 2>/dev/null | grep tg32
.venv/bin/python experiments/bench_failover.py --cost -K 5
$LB -m $M -t 1 -p 0 -n 32 -r 3 2>/dev/null | grep tg32
.venv/bin/python experiments/bench_failover.py --scenario host,worker -K 3 --out /work/bench58/failover
$LB -m $M -t 1 -p 0 -n 32 -r 3 2>/dev/null | grep tg32
date
