#!/bin/bash
# Interleaved proxy runs over SIDES (commits, or WT: the working tree's pipeinfer/, saved to
# /work/b69/wt first and put back at the end). K rounds; prints each run's "# rep" line.
cd /work/main
P="Write a Python LRU cache class with type hints and a usage example."
K=${K:-5}; SIDES=${SIDES:-"edd8b94 HEAD WT"}; NAME=${NAME:-ab3}
rm -rf /work/b69/wt && mkdir -p /work/b69/wt && cp -a pipeinfer /work/b69/wt/
trap 'rm -rf pipeinfer && cp -a /work/b69/wt/pipeinfer . ' EXIT
for rep in $(seq $K); do
  for side in $SIDES; do
    if [ $side = WT ]; then rm -rf pipeinfer && cp -a /work/b69/wt/pipeinfer .; else git checkout -q $side -- pipeinfer; fi
    flock /tmp/cpu.lock .venv/bin/python experiments/bench_peers.py --model ${MODEL:-smollm2} --draft ${DRAFT:-smollm2} \
      --nodes ${NODES:-4} -n ${N:-128} -k 1 --systems ${SYSTEMS:-pipeinfer} --prompt "$P" --out /work/b69/$NAME-$side.csv $EXTRA \
      | grep "^# rep" | sed "s/^# rep 0/# $side rep $rep/"
  done
done
