#!/bin/bash
# The LRU check at two CFS periods, rounds interleaved: iterative and pipeinfer (default split).
cd /work/main
P="Write a Python LRU cache class with type hints and a usage example."
K=${K:-3}; NODES=${NODES:-4}; PERIODS=${PERIODS:-"10000 2000"}; SYSTEMS=${SYSTEMS:-iterative,pipeinfer-default-split}
for rep in $(seq $K); do
  for period in $PERIODS; do
    flock /tmp/cpu.lock .venv/bin/python experiments/bench_peers.py --model qwen-coder --draft qwen-coder-0.5b \
      --nodes $NODES -n 128 -k 1 --systems $SYSTEMS --prompt "$P" --period-us $period \
      --out /work/b68/per/$NAME-$period.csv | grep "^# rep" | sed "s/^# rep 0/# period $period rep $rep/; s/RSS.*head/head/"
  done
done
