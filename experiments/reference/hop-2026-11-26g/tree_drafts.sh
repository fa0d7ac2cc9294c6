#!/bin/bash
# Issue 34, an untested lever at 8 x 0.25 core (the head's draft supply sets the pace): tree
# drafts (-np 2, two branches evaluated in one draft batch) on the plain layout, whose exact
# runs of 7 tokens leave room for a tree (repacked weights cap them at 3). Arms: the defaults,
# --no-repack alone, --no-repack -np 2; interleaved K=3, the bench_peers coding prompt, -n 128.
cd "$(dirname "$0")/../../.."
source experiments/reference/hop-2026-11-26e/arms.sh
# (tree_drafts.txt was printed by a copy of arms.sh's run() without the draft_vocab field)
for rep in 1 2 3; do run ""; run "--no-repack"; run "--no-repack -np 2"; done
