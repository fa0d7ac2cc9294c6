# Sourced by the issue-34 A/B scripts (draft_vocab.sh, ../hop-2026-11-26g/tree_drafts.sh,
# ../hop-2026-11-26h/cross_vocab.sh), from the repository's root: pipeinfer on NODES x CPU core
# nodes (default 8 x 0.25; CPUS, if set, gives each node its own share: cluster.py --cpus),
# the head without target layers and the rest even, the bench_peers coding prompt, -n 128, the
# draft MD (default qwen-coder-0.5b), the pipeinfer of checkout CODE (default this one; a
# patched worktree for a prototype). `run FLAGS` times one arm under the CPU lock and prints
# its speed, acceptance, draft vocabulary, drafted tokens never verified and a hash of the text.
NODES=${NODES:-8}; CPU=${CPU:-0.25}; MD=${MD:-qwen-coder-0.5b}
ROOT=$PWD; PY=$ROOT/.venv/bin/python; CODE=${CODE:-$ROOT}
SPLIT=0$($PY -c "n=$NODES-1; f=[round(1/n, 4)]*(n-1); f.append(round(1-sum(f), 4)); print(''.join(',%g' % x for x in f))")
PROMPT=$($PY -c "import sys; sys.path.insert(0,'experiments'); from bench_peers import CODE_PROMPT, render_prompt; print(render_prompt('qwen-coder-1.5b', CODE_PROMPT))")
run() {  # $1: the flags of the arm ("" for the defaults)
  local quota="--cpu $CPU"; [ -n "${CPUS:-}" ] && quota="--cpus $CPUS"
  (cd "$CODE" && flock /tmp/cpu.lock $PY experiments/cluster.py --nodes $NODES $quota --period-us 10000 -- \
    $PY -m pipeinfer run -m qwen-coder-1.5b -md $MD -p "$PROMPT" -n 128 --ignore-eos -t 1 \
    --json -c 4096 --strategy pipeinfer --layer-split "$SPLIT" $1 2>/dev/null) | tail -1 | \
    $PY -c "import json,sys,hashlib; r=json.load(sys.stdin); print('$NODES x ${CPUS:-$CPU} -md $MD ${1:-default}:', round(r['speed_tps'],2), 't/s accept', r.get('accept_rate'), 'draft_vocab', r.get('draft_vocab'), 'unverified', r.get('n_unverified'), 'text', hashlib.md5(r['text'].encode()).hexdigest()[:8])"
}
