#!/bin/bash
# Issue 48's goals at HEAD on this host: the rarely-right draft and the LRU prompt at
# 4 x 0.5 core, K=5, iterative and pipeinfer alternating their order; 8 x 0.25 core against
# llama.cpp's RPC backend, K=3 (bench_peers interleaves).
cd /work/main
P="Write a Python LRU cache class with type hints and a usage example."
LB="$(.venv/bin/python -m experiments.harness.build_peers --where)/llama-bench"
bench() { flock /tmp/cpu.lock $LB -m ~/.cache/pipeinfer/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf -t 1 -p 0 -n 32 -r 3 | grep tg32; }
echo "## llama-bench before"; bench
for c in rare lru; do
  if [ $c = rare ]; then D="--draft /work/b66/first8.gguf"; else D=""; fi
  for rep in 1 2 3 4 5; do
    if [ $((rep % 2)) = 1 ]; then S="iterative pipeinfer"; else S="pipeinfer iterative"; fi
    for s in $S; do
      flock /tmp/cpu.lock .venv/bin/python experiments/bench_peers.py --nodes 4 -n 128 --systems $s \
        --prompt "$P" $D -k 1 --out /work/b66/r/g2-$c.csv \
        | grep "^# rep" | sed "s/^# rep 0/# $c HEAD rep $rep/"
    done
  done
done
echo "## 8 x 0.25, K=3"
flock /tmp/cpu.lock .venv/bin/python experiments/bench_peers.py --nodes 8 -n 128 -k 3 \
  --systems llama-rpc,pipeinfer --out /work/b66/r/g2-n8.csv | grep -E "^#"
echo "## llama-bench after"; bench
