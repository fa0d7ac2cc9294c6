#!/bin/bash
# The head's CPU per token, SmolLM2 as target and draft, 4 x 0.5 core, LRU prompt, 128
# tokens: wt-b (8c5806b plus the CPU accounting only) against main, interleaved, K=3.
P="Write a Python LRU cache class with type hints and a usage example."
cd /work/bench48
for rep in 1 2 3; do
  for side in old new; do
    PY=/work/main/.venv/bin/python; [ $side = old ] && PY=/work/wt-b/.venv/bin/python
    $PY /work/main/experiments/bench_peers.py --model smollm2 --draft smollm2 --nodes 4 \
      -n 128 -k 1 --systems pipeinfer --prompt "$P" --out /work/bench48/proxy-$side.csv \
      | grep "^# rep" | sed "s/^# rep 0/# $side rep $rep/"
  done
done
