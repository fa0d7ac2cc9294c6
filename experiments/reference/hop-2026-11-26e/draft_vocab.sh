#!/bin/bash
# Issue 34 lever "drafting over a reduced vocabulary" (--draft-vocab K, FR-Spec): pipeinfer on
# NODES x CPU core nodes (default 8 x 0.25, where the head's draft supply sets the pace), the
# bench_peers coding prompt, -n 128, the draft's full vocabulary against K=32768, interleaved, K=3.
# DEFAULT=1 (hop-2026-11-26f/default_flags.sh): the default flags (--draft-vocab auto) against
# --draft-vocab 0 instead; each line says which K the run used.
cd "$(dirname "$0")/../../.."
source experiments/reference/hop-2026-11-26e/arms.sh
if [ "${DEFAULT:-0}" = 1 ]; then
  for rep in 1 2 3; do run ""; run "--draft-vocab 0"; done
else
  run "--draft-vocab 32768" > /dev/null   # makes the reduced draft file once (cached), untimed
  for rep in 1 2 3; do run "--draft-vocab 0"; run "--draft-vocab 32768"; done
fi
