#!/bin/bash
# interleaved A/B of the JSON request with free drafts: main HEAD (/work/wt-base) vs the working tree
cd /work/main
for rep in 1 2 3; do
  for tree in /work/wt-base /work/main; do
    echo -n "rep $rep $tree: "
    PYTHONPATH=$tree FREE=1 .venv/bin/python /tmp/ttft/json_prof.py 2>&1 | grep "^FREE"
  done
done
