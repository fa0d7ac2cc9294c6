#!/bin/bash
# Issue 34 lever "a cheaper draft" (seventh session): SmolLM2 135M, of another vocabulary,
# drafting for Qwen2.5-Coder 1.5B through cross_vocab.patch (the context to the draft as text,
# its drafted text back in the target's tokens; the target verifies as always, so the text is
# unchanged), against the default draft (Qwen2.5-Coder 0.5B, --draft-vocab auto), pipeinfer on
# NODES x CPU core nodes (default 8 x 0.25), the bench_peers coding prompt, -n 128,
# interleaved K=3. The patch is applied in a throwaway worktree; it changes nothing for a
# draft of the target's vocabulary.
cd "$(dirname "$0")/../../.."
ROOT=$PWD; PY=$ROOT/.venv/bin/python
NODES=${NODES:-8}; CPU=${CPU:-0.25}
WT=$(mktemp -d /tmp/xvocab.XXXXXX)
git worktree add -q --detach "$WT" HEAD && cp pipeinfer/_native*.so "$WT/pipeinfer/" &&
  git -C "$WT" apply "$ROOT/experiments/reference/hop-2026-11-26h/cross_vocab.patch" || exit 1
trap 'git worktree remove --force "$WT"' EXIT
SPLIT=0$($PY -c "n=$NODES-1; f=[round(1/n, 4)]*(n-1); f.append(round(1-sum(f), 4)); print(''.join(',%g' % x for x in f))")
PROMPT=$($PY -c "import sys; sys.path.insert(0,'experiments'); from bench_peers import CODE_PROMPT, render_prompt; print(render_prompt('qwen-coder-1.5b', CODE_PROMPT))")
run() {  # $1: the draft model, then its flags
  local md=$1; shift
  (cd "$WT" && flock /tmp/cpu.lock $PY experiments/cluster.py --nodes $NODES --cpu $CPU --period-us 10000 -- \
    $PY -m pipeinfer run -m qwen-coder-1.5b -md $md -p "$PROMPT" -n 128 --ignore-eos -t 1 \
    --json -c 4096 --strategy pipeinfer --layer-split "$SPLIT" "$@" 2>/dev/null) | tail -1 | \
    $PY -c "import json,sys,hashlib; r=json.load(sys.stdin); print('$NODES x $CPU -md $md $*:', round(r['speed_tps'],2), 't/s accept', r.get('accept_rate'), 'unverified', r.get('n_unverified'), 'text', hashlib.md5(r['text'].encode()).hexdigest()[:8])"
}
for rep in 1 2 3; do run qwen-coder-0.5b; run smollm2 --draft-vocab 0; done
