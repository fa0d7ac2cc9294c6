#!/bin/bash
# SmolLM2 with a rarely-right draft (its first 4 layers), 128 tokens: iterative, 721fb99's pipeinfer and HEAD's, K rounds, ABBA.
cd /work/main
K=${K:-4}
NEW=$(git rev-parse --short HEAD)
P="Write a Python LRU cache class with type hints and a usage example."
trap 'git checkout -q HEAD -- pipeinfer' EXIT
run() {  # side system
  git checkout -q $1 -- pipeinfer
  flock /tmp/cpu.lock .venv/bin/python experiments/bench_peers.py --model smollm2 --draft /work/b65/smol_first4.gguf --nodes 4 -n 128 --systems $2 \
    --prompt "$P" -k 1 --out /work/b65/r/smolrare-$1.csv \
    | grep "^# rep" | sed "s/^# rep 0/# smolrare $1 rep $rep/"
}
for rep in $(seq $K); do
  if [ $((rep % 2)) = 1 ]; then
    run 721fb99 iterative; run 721fb99 pipeinfer; run $NEW pipeinfer
  else
    run $NEW pipeinfer; run 721fb99 pipeinfer; run 721fb99 iterative
  fi
done
git checkout -q HEAD -- pipeinfer
