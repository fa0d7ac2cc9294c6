#!/bin/bash
# Issue 48's goals on this host, HEAD only, each check's systems interleaved by bench_peers
# (one run per system per round), the order of the rare check reversed every other round.
cd /work/main
P="Write a Python LRU cache class with type hints and a usage example."
LB="$(.venv/bin/python -m experiments.harness.build_peers --where)/llama-bench"
bench() { flock /tmp/cpu.lock $LB -m ~/.cache/pipeinfer/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf -t 1 -p 0 -n 32 -r 3 | grep tg32; }
echo "## llama-bench before"; bench
echo "## rare (first8), K=4"
for rep in 1 2 3 4; do
  if [ $((rep % 2)) = 1 ]; then S="iterative pipeinfer"; else S="pipeinfer iterative"; fi
  for s in $S; do
    flock /tmp/cpu.lock .venv/bin/python experiments/bench_peers.py --nodes 4 -n 128 --systems $s \
      --prompt "$P" --draft /work/b66/first8.gguf -k 1 --out /work/b66/r/rare.csv \
      | grep "^# rep" | sed "s/^# rep 0/# rare $s rep $rep/"
  done
done
echo "## LRU, K=3"
flock /tmp/cpu.lock .venv/bin/python experiments/bench_peers.py --nodes 4 -n 128 -k 3 \
  --systems iterative,pipeinfer --prompt "$P" --out /work/b66/r/lru.csv | grep -E "^#"
echo "## 8 x 0.25, K=3"
flock /tmp/cpu.lock .venv/bin/python experiments/bench_peers.py --nodes 8 -n 128 -k 3 --draft-max 8 \
  --systems llama-rpc,llama-rpc-spec,pipeinfer --out /work/b66/r/n8.csv | grep -E "^#"
echo "## llama-bench after"; bench
