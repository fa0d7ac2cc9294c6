#!/bin/bash
# Issue 34 lever "drafting over a reduced vocabulary" (--draft-vocab K, FR-Spec): pipeinfer on
# NODES x CPU core nodes (default 8 x 0.25, where the head's draft supply sets the pace), the
# bench_peers coding prompt, -n 128, the draft's full vocabulary against K=32768, interleaved, K=3.
# DEFAULT=1 (hop-2026-11-26f/default_flags.sh): the default flags (--draft-vocab auto) against
# --draft-vocab 0 instead; each line says which K the run used.
cd "$(dirname "$0")/../../.."
NODES=${NODES:-8}; CPU=${CPU:-0.25}
SPLIT=0$(.venv/bin/python -c "n=$NODES-1; f=[round(1/n, 4)]*(n-1); f.append(round(1-sum(f), 4)); print(''.join(',%g' % x for x in f))")
PROMPT=$(.venv/bin/python -c "import sys; sys.path.insert(0,'experiments'); from bench_peers import CODE_PROMPT, render_prompt; print(render_prompt('qwen-coder-1.5b', CODE_PROMPT))")
run() {  # $1: the flags of the arm ("" for the defaults)
  flock /tmp/cpu.lock .venv/bin/python experiments/cluster.py --nodes $NODES --cpu $CPU --period-us 10000 -- \
    .venv/bin/pipeinfer run -m qwen-coder-1.5b -md qwen-coder-0.5b -p "$PROMPT" -n 128 --ignore-eos -t 1 \
    --json -c 4096 --strategy pipeinfer --layer-split "$SPLIT" $1 2>/dev/null | tail -1 | \
    .venv/bin/python -c "import json,sys,hashlib; r=json.load(sys.stdin); print('$NODES x $CPU ${1:-default}:', round(r['speed_tps'],2), 't/s accept', r.get('accept_rate'), 'draft_vocab', r.get('draft_vocab'), 'text', hashlib.md5(r['text'].encode()).hexdigest()[:8])"
}
if [ "${DEFAULT:-0}" = 1 ]; then
  for rep in 1 2 3; do run ""; run "--draft-vocab 0"; done
else
  run "--draft-vocab 32768" > /dev/null   # makes the reduced draft file once (cached), untimed
  for rep in 1 2 3; do run "--draft-vocab 0"; run "--draft-vocab 32768"; done
fi
