#!/bin/bash
# The final code (HEAD) against 721fb99 on the LRU prompt (middling acceptance), Qwen 1.5B with
# the 0.5B draft, 4 x 0.5 core, 128 tokens, iterative as the reference, alternating order.
cd /work/main
K=${K:-3}
NEW=$(git rev-parse --short HEAD)
P="Write a Python LRU cache class with type hints and a usage example."
trap 'git checkout -q HEAD -- pipeinfer' EXIT
run() {  # side system
  git checkout -q $1 -- pipeinfer
  flock /tmp/cpu.lock .venv/bin/python experiments/bench_peers.py --nodes 4 -n 128 --systems $2 \
    --prompt "$P" -k 1 --out /work/b65/r/lru12-$1.csv | grep "^# rep" | sed "s/^# rep 0/# lru $1 rep $rep/"
}
for rep in $(seq $K); do
  if [ $((rep % 2)) = 1 ]; then
    run 721fb99 iterative; run 721fb99 pipeinfer; run $NEW pipeinfer
  else
    run $NEW pipeinfer; run 721fb99 pipeinfer; run 721fb99 iterative
  fi
done
git checkout -q HEAD -- pipeinfer
