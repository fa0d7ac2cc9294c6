#!/bin/bash
# Issue 34: the draft model's lookahead (--draft-lookahead 3: each draft step also checks 3
# tokens the text suggests, in one batch of 4) against plain drafting, pipeinfer at N
# quarter-core nodes (default 8; NODES=2 / 4 for the others), interleaved K=3, -n 128, the
# bench_peers coding prompt, under the CPU lock (arms.sh). The text hash must be the same.
# Needs lookahead.patch applied (git apply); not part of pipeinfer.
cd "$(dirname "$0")/../../.."
source experiments/reference/hop-2026-11-26e/arms.sh
for rep in 1 2 3; do run ""; run "--draft-lookahead 3"; done
