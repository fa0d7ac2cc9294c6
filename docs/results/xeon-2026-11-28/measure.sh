#!/bin/bash
# Intel host: the goals of issues 48 and 47, each step under the exclusive CPU lock.
set -x
cd /work/main
PY=/work/main/.venv/bin/python
B=$($PY -m experiments.harness.build_peers --where)/llama-bench
M=~/.cache/pipeinfer/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
OUT=/work/b59/spec
LRU="Write a Python LRU cache class with type hints and a usage example."
bench() { flock /tmp/cpu.lock "$B" -m "$M" -t 1 -p 0 -n 32 -r 3; }
bench
flock /tmp/cpu.lock $PY experiments/bench_peers.py --nodes 4 -n 128 -k 3 --systems iterative,pipeinfer \
    --prompt "$LRU" --out $OUT/goal2.csv
flock /tmp/cpu.lock $PY experiments/bench_peers.py --nodes 4 -n 128 -k 3 --systems iterative,pipeinfer \
    --prompt "$LRU" --draft $OUT/first8.gguf --out $OUT/goal1.csv
bench
flock /tmp/cpu.lock $PY experiments/bench_peers.py --nodes 4 -k 3 --systems llama-rpc,iterative,pipeinfer \
    --prompt-tokens 1700 -n 16 --out $OUT/prefill.csv
bench
flock /tmp/cpu.lock $PY experiments/bench_peers.py --nodes 8 -n 128 -k 3 --draft-max 8 \
    --systems llama-rpc,llama-rpc-spec,pipeinfer --out $OUT/goal3.csv
bench
