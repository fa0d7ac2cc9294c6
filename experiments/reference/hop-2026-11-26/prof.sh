#!/bin/bash
# usage: prof.sh WORKTREE NODES TAG [extra pipeinfer args]
wt=$1; nodes=$2; tag=$3; shift 3
cpu=${CPU:-$(python3 -c "print(2/$nodes)")}
split=$(python3 -c "print(','.join(['0.0']+[repr(1/($nodes-1))]*($nodes-1)))")
cd $wt
flock /tmp/cpu.lock .venv/bin/python experiments/cluster.py --nodes $nodes --cpu $cpu -- \
  $wt/.venv/bin/pipeinfer run -m qwen-coder-1.5b --chat -p "Write a Python function that parses a CSV file of transactions (date, amount, category) and returns the total amount per category, sorted by amount." \
  -n 48 --ignore-eos -t 1 --json --strategy iterative --layer-split $split --trace /tmp/hop/$tag.jsonl "$@" > /tmp/hop/$tag.json 2>/tmp/hop/$tag.err
python3 - /tmp/hop/$tag.json <<'PY'
import json,sys
d=json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print("speed_tps", d["speed_tps"], "itl_s", d["itl_s"])
for s in d["rank_stats"]:
    print(" rank", s["rank"], "busy_s %.2f" % s.get("busy_s",0), "wall_s %.2f" % s.get("wall_s",0), "cpu_s", s.get("cpu_s"))
PY
$wt/.venv/bin/python /work/wt-hop/experiments/hop_breakdown.py /tmp/hop/$tag.jsonl
