#!/bin/bash
# Layer splits between decode-balanced (11/12/5) and even (9/9/10) on 4 x 0.5: a 1,700-token
# prefill (K=3) against llama.cpp RPC, then the LRU question's decoding (K=5).
cd /work/main
P="Write a Python LRU cache class with type hints and a usage example."
V1='s11-11-6=--layer-split 0,0.39285714,0.39285714,0.21428572'
V2='s10-11-7=--layer-split 0,0.35714286,0.39285714,0.25'
echo "## prefill, 1,700 tokens (K=3)"
flock /tmp/cpu.lock .venv/bin/python experiments/bench_peers.py --nodes 4 -k 3 --prompt-tokens 1700 -n 16 \
  --systems llama-rpc,pipeinfer-default-split,pipeinfer --variant "$V1" --variant "$V2" --out /tmp/splits-prefill.csv | grep -v "^wrote"
echo "## LRU (K=5)"
flock /tmp/cpu.lock .venv/bin/python experiments/bench_peers.py --model qwen-coder --draft qwen-coder-0.5b --nodes 4 -n 128 -k 5 \
  --systems iterative,pipeinfer-default-split,pipeinfer --variant "$V1" --variant "$V2" --prompt "$P" --out /tmp/splits-lru.csv | grep -v "^wrote"
