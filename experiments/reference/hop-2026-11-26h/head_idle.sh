#!/bin/bash
# Issue 34, 8 x 0.25 core (seventh session): does the head's draft idle because the schedule
# holds it back? Its quarter core was ~84 % used in a default run (draft thread ~70 %, loop
# ~14 %, per-thread CPU from /proc). Arms: the defaults; no cutoff rise per speculative run
# (-pr 0); more runs in flight than the 7 target stages (--max-runs 10). Interleaved K=3.
cd "$(dirname "$0")/../../.."
source experiments/reference/hop-2026-11-26e/arms.sh
for rep in 1 2 3; do run ""; run "-pr 0"; run "--max-runs 10"; done
