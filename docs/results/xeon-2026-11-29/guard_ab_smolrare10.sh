#!/bin/bash
# The fast-host proxy of a rarely-right draft: iterative, f26aeb3 and 9b6b821, K rounds
# in alternating order.
cd /work/main
K=${K:-10}
P="Write a Python LRU cache class with type hints and a usage example."
trap 'git checkout -q HEAD -- pipeinfer' EXIT
run() {  # side system
  git checkout -q $1 -- pipeinfer
  flock /tmp/cpu.lock .venv/bin/python experiments/bench_peers.py --model smollm2 --draft /work/b65/smol_first4.gguf \
    --nodes 4 -n 128 --systems $2 --prompt "$P" -k 1 --out /work/b65/r/sr11-$1.csv \
    | grep "^# rep" | sed "s/^# rep 0/# smolrare $1 rep $rep/"
}
for rep in $(seq $K); do
  if [ $((rep % 2)) = 1 ]; then
    run 9b6b821 iterative; run f26aeb3 pipeinfer; run 9b6b821 pipeinfer
  else
    run 9b6b821 pipeinfer; run f26aeb3 pipeinfer; run 9b6b821 iterative
  fi
done
git checkout -q HEAD -- pipeinfer
