#!/bin/bash
# Issue 48's goals under the fitted CFS period (2 ms at 0.5 core, 4 ms at 0.25), one after another.
# K8: the repeats at 8 x 0.25 (3 unless given; goals6.out ran with K8=5).
K8=${K8:-3}
cd /work/main
mkdir -p /tmp/goals5
P="Write a Python LRU cache class with type hints and a usage example."
O=/tmp/goals5
B=$(.venv/bin/python -m experiments.harness.build_peers --where)/llama-bench
flock /tmp/cpu.lock $B -m ~/.cache/pipeinfer/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf -t 1 -p 0 -n 32 -r 3 2>/dev/null | grep tg32
echo "## LRU, 4 x 0.5 (K=5)"
flock /tmp/cpu.lock .venv/bin/python experiments/bench_peers.py --model qwen-coder --draft qwen-coder-0.5b \
  --nodes 4 -n 128 -k 5 --systems iterative,pipeinfer-default-split --prompt "$P" --out $O/lru.csv | grep "^# rep\|t/s"
echo "## rarely right (the 0.5B's first 8 layers), 4 x 0.5 (K=5)"
flock /tmp/cpu.lock .venv/bin/python experiments/bench_peers.py --model qwen-coder --draft /work/b66/first8.gguf \
  --nodes 4 -n 128 -k 5 --systems iterative,pipeinfer-default-split --prompt "$P" --out $O/rare.csv | grep "^# rep\|t/s"
echo "## 8 x 0.25 against llama.cpp RPC (K=$K8)"
flock /tmp/cpu.lock .venv/bin/python experiments/bench_peers.py --model qwen-coder --draft qwen-coder-0.5b \
  --nodes 8 -n 128 -k $K8 --systems llama-rpc,iterative,pipeinfer-default-split --draft-max 8 --prompt "$P" --out $O/n8.csv | grep "^# rep\|t/s"
flock /tmp/cpu.lock $B -m ~/.cache/pipeinfer/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf -t 1 -p 0 -n 32 -r 3 2>/dev/null | grep tg32
