#!/bin/bash
# Interleaved, per repeat: llama.cpp RPC; iterative + pipeinfer with wake-ups over UDP between
# the emulated nodes (each its own PIPEINFER_HOST_ID, cluster.py's default); iterative with the
# network wake-ups off (PIPEINFER_WAKE_ADDR=none: the nodes poll each other, as in hop-2026-11-26b).
# Run from the worktree with the main venv: PYTHONPATH points the imports at this code.
cd /work/wt-hop
export PYTHONPATH=/work/wt-hop
PY=/work/main/.venv/bin/python
out=/work/wt-hop/experiments/reference/hop-2026-11-26c
for rep in 1 2 3; do
  echo "=== rep $rep rpc $(date -u +%H:%M:%S)"
  flock /tmp/cpu.lock $PY experiments/bench_peers.py --nodes 4,8 -n 128 -k 1 --systems llama-rpc --out $out/rpc.csv
  echo "=== rep $rep udp $(date -u +%H:%M:%S)"
  flock /tmp/cpu.lock $PY experiments/bench_peers.py --nodes 4,8 -n 128 -k 1 --systems iterative,pipeinfer --out $out/udp.csv
  echo "=== rep $rep poll $(date -u +%H:%M:%S)"
  PIPEINFER_WAKE_ADDR=none flock /tmp/cpu.lock $PY experiments/bench_peers.py --nodes 4,8 -n 128 -k 1 --systems iterative --out $out/poll.csv
done
echo "=== done $(date -u +%H:%M:%S)"
