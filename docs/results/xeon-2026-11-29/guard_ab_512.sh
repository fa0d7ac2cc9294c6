#!/bin/bash
# The SmolLM2 proxy with 512 tokens: 721fb99 against HEAD, interleaved, K rounds.
cd /work/main
K=${K:-3}
NEW=$(git rev-parse --short HEAD)
P="Write a Python LRU cache class with type hints and a usage example."
trap 'git checkout -q HEAD -- pipeinfer' EXIT
run() {  # side label args...
  side=$1; label=$2; shift 2
  git checkout -q $side -- pipeinfer
  flock /tmp/cpu.lock .venv/bin/python experiments/bench_peers.py "$@" -k 1 --out /work/b65/r/$label-$side.csv \
    | grep "^# rep" | sed "s/^# rep 0/# $label $side rep $rep/"
}
for rep in $(seq $K); do
  run 721fb99 proxy512 --model smollm2 --draft smollm2 --nodes 4 -n 512 --systems iterative,pipeinfer --prompt "$P"
  run $NEW proxy512 --model smollm2 --draft smollm2 --nodes 4 -n 512 --systems pipeinfer --prompt "$P"
done
git checkout -q HEAD -- pipeinfer
