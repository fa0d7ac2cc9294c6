#!/bin/bash
# bench_peers over commits, interleaved: for each of K rounds, each side's pipeinfer/ is
# checked out into the working tree the benchmark runs (editable install), one run per
# system; HEAD's is put back at the end. ARGS: bench_peers' arguments (without -k, --out).
cd /work/main
K=${K:-3}
SIDES=${SIDES:-"c79d58a HEAD"}
OUT=${OUT:-/work/b63/r/ab}
trap 'git checkout -q HEAD -- pipeinfer' EXIT
for rep in $(seq $K); do
  for side in $SIDES; do
    git checkout -q $side -- pipeinfer
    eval flock /tmp/cpu.lock .venv/bin/python experiments/bench_peers.py $ARGS -k 1 \
      --out $OUT-$side.csv | grep "^# rep" | sed "s/^# rep 0/# $side rep $rep/"
  done
done
