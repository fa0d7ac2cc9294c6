#!/bin/bash
# Issue 34 lever "a cheaper draft" (seventh session): SmolLM2 135M, of another vocabulary,
# drafting for Qwen2.5-Coder 1.5B through cross_vocab.patch (the context to the draft as text,
# its drafted text back in the target's tokens; the target verifies as always, so the text is
# unchanged), against the default draft (Qwen2.5-Coder 0.5B, --draft-vocab auto), pipeinfer on
# NODES x CPU core nodes (default 8 x 0.25), the bench_peers coding prompt, -n 128,
# interleaved K=3. The patch is applied in a throwaway worktree; it changes nothing for a
# draft of the target's vocabulary.
cd "$(dirname "$0")/../../.."
WT=$(mktemp -d /tmp/xvocab.XXXXXX)
git worktree add -q --detach "$WT" HEAD && cp pipeinfer/_native*.so "$WT/pipeinfer/" &&
  git -C "$WT" apply experiments/reference/hop-2026-11-26h/cross_vocab.patch || exit 1
trap 'git worktree remove --force "$WT"' EXIT
CODE=$WT; source experiments/reference/hop-2026-11-26e/arms.sh
for rep in 1 2 3; do MD=qwen-coder-0.5b run ""; MD=smollm2 run "--draft-vocab 0"; done
