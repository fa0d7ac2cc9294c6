#!/bin/bash
# pipeinfer at 4 nodes x 0.5 core against llama.cpp RPC: the even split (9/10/9 layers,
# the output matrix on the last) against llama.cpp's own layers per node (--same-slices:
# 10/10/8 + output), interleaved per repeat, each under the CPU lock.
cd /work/main
out=experiments/reference/hop-2026-11-26d
for rep in 1 2 3; do
  flock /tmp/cpu.lock .venv/bin/python experiments/bench_peers.py --nodes 4 -n 128 -k 1 --systems llama-rpc,iterative,pipeinfer --out $out/even.csv
  flock /tmp/cpu.lock .venv/bin/python experiments/bench_peers.py --nodes 4 -n 128 -k 1 --systems iterative,pipeinfer --same-slices --out $out/same-slices.csv
done
