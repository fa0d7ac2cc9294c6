#!/bin/bash
# rare (first8) and LRU (0.5B draft), iterative, OLD's pipeinfer and NEW's, K rounds, order
# reversed every other round.
cd /work/main
K=${K:-3}; OLD=${OLD:-c58076f}; NEW=${NEW:-$(git rev-parse --short HEAD)}
P="Write a Python LRU cache class with type hints and a usage example."
trap 'git checkout -q HEAD -- pipeinfer' EXIT
run() {  # side system check
  git checkout -q $1 -- pipeinfer
  if [ $3 = rare ]; then D="--draft /work/b66/first8.gguf"; else D=""; fi
  flock /tmp/cpu.lock .venv/bin/python experiments/bench_peers.py --nodes 4 -n 128 --systems $2 \
    --prompt "$P" $D -k 1 --out /work/b66/r/ab-$3-$1.csv \
    | grep "^# rep" | sed "s/^# rep 0/# $3 $1 rep $rep/"
}
for rep in $(seq $K); do
  for c in rare lru; do
    if [ $((rep % 2)) = 1 ]; then
      run $OLD iterative $c; run $OLD pipeinfer $c; run $NEW pipeinfer $c
    else
      run $NEW pipeinfer $c; run $OLD pipeinfer $c; run $OLD iterative $c
    fi
  done
done
git checkout -q HEAD -- pipeinfer
