#!/bin/bash
# The head's loop CPU per token on the SmolLM2 proxy (target and draft SmolLM2, 4 x 0.5 core,
# the LRU-cache prompt, 128 tokens), interleaved over commits, K runs each. Each side's
# pipeinfer/ is checked out into the working tree the benchmark runs (editable install), then
# HEAD's is put back. c79d58a reports the loop as the process less the draft jobs (the old
# definition); edd8b94 is c79d58a with the loop counted on the driver's thread only.
cd /work/main
P="Write a Python LRU cache class with type hints and a usage example."
K=${K:-3}
SIDES=${SIDES:-"edd8b94 HEAD"}
OUT=${OUT:-/work/b66/r/proxy}
trap 'git checkout -q HEAD -- pipeinfer' EXIT
for rep in $(seq $K); do
  for side in $SIDES; do
    git checkout -q $side -- pipeinfer
    flock /tmp/cpu.lock .venv/bin/python experiments/bench_peers.py --model smollm2 --draft smollm2 \
      --nodes 4 -n 128 -k 1 --systems pipeinfer --prompt "$P" --out $OUT-$side.csv \
      | grep "^# rep" | sed "s/^# rep 0/# $side rep $rep/"
  done
done
git checkout -q HEAD -- pipeinfer
