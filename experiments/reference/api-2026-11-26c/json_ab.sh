#!/bin/bash
# interleaved A/B of the JSON request (free drafts on) on SYSTEM (bench_serve.PIPEINFER_SYSTEMS):
# main before the change (/work/wt-base) against the working tree (/work/main), K=3
cd /work/main
SYSTEM=${SYSTEM:-pipeinfer}
for rep in 1 2 3; do
  for tree in /work/wt-base /work/main; do
    echo -n "$SYSTEM rep $rep $tree: "
    PYTHONPATH=$tree FREE=1 flock /tmp/cpu.lock .venv/bin/python experiments/reference/api-2026-11-26b/json_prof.py --json-system $SYSTEM 2>&1 | grep "^FREE"
  done
done
