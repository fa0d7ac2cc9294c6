#!/bin/bash
# The LRU prompt at NODES (4) x 2/NODES core, pipeinfer's default split: iterative, OLD's pipeinfer and
# NEW's, K rounds in alternating order (each side's pipeinfer/ checked out into the tree the
# benchmark runs, HEAD's put back); CHECKS="lru rare" adds the first-8-layers draft.
cd /work/main
NODES=${NODES:-4}; K=${K:-5}; OLD=${OLD:-0c972df}; NEW=${NEW:-$(git rev-parse --short HEAD)}; OUT=${OUT:-/work/b67/r}
P="Write a Python LRU cache class with type hints and a usage example."
CHECKS=${CHECKS:-lru}
trap 'git checkout -q HEAD -- pipeinfer' EXIT
run() {  # side system check
  git checkout -q $1 -- pipeinfer
  if [ $3 = rare ]; then D="--draft /work/b66/first8.gguf"; else D=""; fi
  flock /tmp/cpu.lock .venv/bin/python experiments/bench_peers.py --nodes $NODES -n 128 --systems $2 \
    --prompt "$P" $D -k 1 --out $OUT/ab3-$NODES-$3-$1.csv \
    | grep "^# rep" | sed "s/^# rep 0/# $3 $1 rep $rep/"
}
for rep in $(seq $K); do
  for c in $CHECKS; do
    if [ $((rep % 2)) = 1 ]; then
      run $OLD iterative $c; run $OLD pipeinfer-default-split $c; run $NEW pipeinfer-default-split $c
    else
      run $NEW pipeinfer-default-split $c; run $OLD pipeinfer-default-split $c; run $OLD iterative $c
    fi
  done
done
git checkout -q HEAD -- pipeinfer
