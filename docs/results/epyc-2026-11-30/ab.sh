#!/bin/bash
# Interleaved A/B of the proxy's head loop CPU per token: BASE (a commit) against the working
# tree's pipeinfer/ (saved to /work/b68/wt first, put back at the end). K rounds.
cd /work/main
P="Write a Python LRU cache class with type hints and a usage example."
K=${K:-5}; BASE=${BASE:-HEAD}; NAME=${NAME:-ab}
rm -rf /work/b68/wt && mkdir -p /work/b68/wt && cp -a pipeinfer /work/b68/wt/
trap 'rm -rf pipeinfer && cp -a /work/b68/wt/pipeinfer . ' EXIT
for rep in $(seq $K); do
  for side in $BASE WT; do
    if [ $side = WT ]; then rm -rf pipeinfer && cp -a /work/b68/wt/pipeinfer .; else git checkout -q $side -- pipeinfer; fi
    flock /tmp/cpu.lock .venv/bin/python experiments/bench_peers.py --model ${MODEL:-smollm2} --draft ${DRAFT:-smollm2} \
      --nodes ${NODES:-4} -n ${N:-128} -k 1 --systems ${SYSTEMS:-pipeinfer} --prompt "$P" --out /work/b68/$NAME-$side.csv $EXTRA \
      | grep "^# rep" | sed "s/^# rep 0/# $side rep $rep/"
  done
done
