#!/bin/bash
# The rarely-right draft: iterative, 721fb99's pipeinfer and HEAD's, K rounds, the order
# reversed every other round (the host's speed drifts within a round).
cd /work/main
K=${K:-4}
NEW=$(git rev-parse --short HEAD)
P="Write a Python LRU cache class with type hints and a usage example."
trap 'git checkout -q HEAD -- pipeinfer' EXIT
run() {  # side system
  git checkout -q $1 -- pipeinfer
  flock /tmp/cpu.lock .venv/bin/python experiments/bench_peers.py --nodes 4 -n 128 --systems $2 \
    --prompt "$P" --draft /work/b63/first8.gguf -k 1 --out /work/b65/r/rare6-$1.csv \
    | grep "^# rep" | sed "s/^# rep 0/# rare $1 rep $rep/"
}
for rep in $(seq $K); do
  if [ $((rep % 2)) = 1 ]; then
    run 721fb99 iterative; run 721fb99 pipeinfer; run $NEW pipeinfer
  else
    run $NEW pipeinfer; run 721fb99 pipeinfer; run 721fb99 iterative
  fi
done
git checkout -q HEAD -- pipeinfer
