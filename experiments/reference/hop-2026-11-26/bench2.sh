#!/bin/bash
# Second set (iterative only): per repeat, base (c8ae6d2) iterative, llama.cpp RPC, this branch iterative.
out=/work/wt-hop/experiments/reference/hop-2026-11-26
for rep in 1 2 3; do
  echo "=== rep $rep base $(date -u +%H:%M:%S)"
  (cd /work/wt-hop-base && flock /tmp/cpu.lock .venv/bin/python experiments/bench_peers.py --nodes 4,8 -n 128 -k 1 --systems iterative --out $out/base2.csv)
  echo "=== rep $rep rpc $(date -u +%H:%M:%S)"
  (cd /work/wt-hop && flock /tmp/cpu.lock .venv/bin/python experiments/bench_peers.py --nodes 4,8 -n 128 -k 1 --systems llama-rpc --out $out/rpc2.csv)
  echo "=== rep $rep branch $(date -u +%H:%M:%S)"
  (cd /work/wt-hop && flock /tmp/cpu.lock .venv/bin/python experiments/bench_peers.py --nodes 4,8 -n 128 -k 1 --systems iterative --out $out/branch2.csv)
done
echo "=== done $(date -u +%H:%M:%S)"
