#!/bin/bash
# Before (721fb99) and after (2666fb3), interleaved, K rounds: the SmolLM2 proxy (self-draft,
# a draft that cannot pay), the rarely-right draft and the LRU prompt (Qwen 1.5B + 0.5B).
cd /work/main
K=${K:-3}
P="Write a Python LRU cache class with type hints and a usage example."
trap 'git checkout -q HEAD -- pipeinfer' EXIT
run() {  # side label args...
  side=$1; label=$2; shift 2
  git checkout -q $side -- pipeinfer
  flock /tmp/cpu.lock .venv/bin/python experiments/bench_peers.py "$@" -k 1 --out /work/b65/r/$label-$side.csv \
    | grep "^# rep" | sed "s/^# rep 0/# $label $side rep $rep/"
}
for rep in $(seq $K); do
  run 721fb99 proxy --model smollm2 --draft smollm2 --nodes 4 -n 128 --systems iterative,pipeinfer --prompt "$P"
  run 2666fb3 proxy --model smollm2 --draft smollm2 --nodes 4 -n 128 --systems pipeinfer --prompt "$P"
  run 721fb99 rare --nodes 4 -n 128 --systems iterative,pipeinfer --prompt "$P" --draft /work/b63/first8.gguf
  run 2666fb3 rare --nodes 4 -n 128 --systems pipeinfer --prompt "$P" --draft /work/b63/first8.gguf
  run 721fb99 lru --nodes 4 -n 128 --systems iterative,pipeinfer --prompt "$P"
  run 2666fb3 lru --nodes 4 -n 128 --systems pipeinfer --prompt "$P"
done
git checkout -q HEAD -- pipeinfer
