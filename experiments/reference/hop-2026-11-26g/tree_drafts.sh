#!/bin/bash
# Issue 34, an untested lever at 8 x 0.25 core (the head's draft supply sets the pace): tree
# drafts (-np 2, two branches evaluated in one draft batch) on the plain layout, whose exact
# runs of 7 tokens leave room for a tree (repacked weights cap them at 3). Arms: the defaults,
# --no-repack alone, --no-repack -np 2; interleaved K=3, the bench_peers coding prompt, -n 128.
cd "$(dirname "$0")/../../.."
NODES=${NODES:-8}; CPU=${CPU:-0.25}
SPLIT=0$(.venv/bin/python -c "n=$NODES-1; f=[round(1/n, 4)]*(n-1); f.append(round(1-sum(f), 4)); print(''.join(',%g' % x for x in f))")
PROMPT=$(.venv/bin/python -c "import sys; sys.path.insert(0,'experiments'); from bench_peers import CODE_PROMPT, render_prompt; print(render_prompt('qwen-coder-1.5b', CODE_PROMPT))")
run() {  # $1: the flags of the arm ("" for the defaults)
  flock /tmp/cpu.lock .venv/bin/python experiments/cluster.py --nodes $NODES --cpu $CPU --period-us 10000 -- \
    .venv/bin/pipeinfer run -m qwen-coder-1.5b -md qwen-coder-0.5b -p "$PROMPT" -n 128 --ignore-eos -t 1 \
    --json -c 4096 --strategy pipeinfer --layer-split "$SPLIT" $1 2>/dev/null | tail -1 | \
    .venv/bin/python -c "import json,sys,hashlib; r=json.load(sys.stdin); print('$NODES x $CPU ${1:-default}:', round(r['speed_tps'],2), 't/s accept', r.get('accept_rate'), 'text', hashlib.md5(r['text'].encode()).hexdigest()[:8])"
}
for rep in 1 2 3; do run ""; run "--no-repack"; run "--no-repack -np 2"; done
