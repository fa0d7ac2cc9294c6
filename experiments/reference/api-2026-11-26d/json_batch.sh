#!/bin/bash
# The JSON-schema request (experiments/json_task.py) on 4 nodes x 0.5 core, free drafts against
# none, K=3 interleaved, for the strategies the README's table lists; then the free-draft arm of
# speculative on the plain layout before (/work/wt-base: main at 4c37bb2, free drafts bounded
# by --draft) and after DraftJob.room. Every run under the CPU lock.
cd /work/main
OUT=experiments/reference/api-2026-11-26d
for system in pipeinfer-speculative-plain pipeinfer-plain pipeinfer; do
  flock /tmp/cpu.lock .venv/bin/python experiments/bench_turns.py -k 3 --scenario json \
      --json-system $system > $OUT/json-$system.txt 2>&1
done
SYSTEM=pipeinfer-speculative-plain bash experiments/reference/api-2026-11-26c/json_ab.sh \
    > $OUT/room-ab-speculative-plain.txt 2>&1
