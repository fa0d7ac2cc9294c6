#!/bin/bash
# Issue 34 lever "the draft model on a rank of its own": 8 nodes x 0.25 core, -n 128, the
# bench_peers coding prompt; pipespec with the 0.5B draft on the head (7 target workers) and
# on a rank of its own (6 target workers, --layer-split .../1), interleaved, K=3.
cd "$(dirname "$0")/../../.."
PROMPT=$(.venv/bin/python -c "import sys; sys.path.insert(0,'experiments'); from bench_peers import CODE_PROMPT, render_prompt; print(render_prompt('qwen-coder-1.5b', CODE_PROMPT))")
run() {  # $1 label, $2 strategy, $3 split
  flock /tmp/cpu.lock .venv/bin/python experiments/cluster.py --nodes 8 --cpu 0.25 --period-us 10000 -- \
    .venv/bin/pipeinfer run -m qwen-coder-1.5b -md qwen-coder-0.5b -p "$PROMPT" -n 128 --ignore-eos -t 1 \
    --json -c 4096 --strategy $2 --layer-split "$3" 2>/dev/null | tail -1 | \
    .venv/bin/python -c "import json,sys; r=json.load(sys.stdin); print('$1', round(r['speed_tps'],2), 't/s accept', r.get('accept_rate'))"
}
for rep in 1 2 3; do
  run "pipeinfer head-draft" pipeinfer 0,0.143,0.143,0.143,0.143,0.143,0.143,0.142
  run "pipespec head-draft" pipespec 0,0.143,0.143,0.143,0.143,0.143,0.143,0.142
  run "pipespec draft-rank" pipespec 0,0.1667,0.1667,0.1667,0.1667,0.1666,0.1666/1
done
