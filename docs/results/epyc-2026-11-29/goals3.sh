#!/bin/bash
# Issue 48's goals at HEAD after row costs and the guard's error band: the LRU prompt and the
# rarely-right draft at 4 x 0.5 core (K=5, bench_peers interleaves: iterative, pipeinfer with
# the even split the peers get, pipeinfer with its own default split), 8 x 0.25 core against
# llama.cpp's RPC backend (K=3), llama-bench around them.
cd /work/main
P="Write a Python LRU cache class with type hints and a usage example."
OUT=${OUT:-/work/b67/r}
LB="$(.venv/bin/python -m experiments.harness.build_peers --where)/llama-bench"
bench() { flock /tmp/cpu.lock $LB -m ~/.cache/pipeinfer/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf -t 1 -p 0 -n 32 -r 3 | grep tg32; }
echo "## llama-bench before"; bench
echo "## LRU, 4 x 0.5, K=5"
flock /tmp/cpu.lock .venv/bin/python experiments/bench_peers.py --nodes 4 -n 128 -k 5 \
  --systems iterative,pipeinfer,pipeinfer-default-split --prompt "$P" --out $OUT/g3-lru.csv | grep -E "^#|^  "
echo "## rarely right (first8), 4 x 0.5, K=5"
flock /tmp/cpu.lock .venv/bin/python experiments/bench_peers.py --nodes 4 -n 128 -k 5 \
  --systems iterative,pipeinfer,pipeinfer-default-split --draft /work/b66/first8.gguf \
  --prompt "$P" --out $OUT/g3-rare.csv | grep -E "^#|^  "
echo "## 8 x 0.25, K=3"
flock /tmp/cpu.lock .venv/bin/python experiments/bench_peers.py --nodes 8 -n 128 -k 3 \
  --systems llama-rpc,pipeinfer,pipeinfer-default-split --out $OUT/g3-n8.csv | grep -E "^#|^  "
echo "## llama-bench after"; bench
