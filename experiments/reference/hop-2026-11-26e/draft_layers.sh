#!/bin/bash
# Issue 34, a lever for the next round: a shallower draft. The compact 0.5B draft cut to its
# first 16 or 12 of 24 layers (with its output head; write_stage(keep_tokenizer=True) into
# /tmp/trunc/), pipeinfer on 8 x 0.25 core, -n 128, the bench_peers prompt, interleaved, K=2.
cd "$(dirname "$0")/../../.."
SPLIT=0,0.1429,0.1429,0.1429,0.1429,0.1429,0.1429,0.1426
PROMPT=$(.venv/bin/python -c "import sys; sys.path.insert(0,'experiments'); from bench_peers import CODE_PROMPT, render_prompt; print(render_prompt('qwen-coder-1.5b', CODE_PROMPT))")
run() {  # $1 label, $2 draft
  flock /tmp/cpu.lock .venv/bin/python experiments/cluster.py --nodes 8 --cpu 0.25 --period-us 10000 -- \
    .venv/bin/pipeinfer run -m qwen-coder-1.5b -md $2 -p "$PROMPT" -n 128 --ignore-eos -t 1 \
    --json -c 4096 --strategy pipeinfer --layer-split "$SPLIT" 2>/dev/null | tail -1 | \
    .venv/bin/python -c "import json,sys,hashlib; r=json.load(sys.stdin); print('$1:', round(r['speed_tps'],2), 't/s accept', r.get('accept_rate'), 'text', hashlib.md5(r['text'].encode()).hexdigest()[:8])"
}
for rep in 1 2; do
  run "draft 24 layers" qwen-coder-0.5b
  run "draft first 16" /tmp/trunc/first16.gguf
  run "draft first 12" /tmp/trunc/first12.gguf
done
