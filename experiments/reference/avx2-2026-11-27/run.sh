#!/bin/bash
# Issue 34's per-hop and speculation goals with llama.cpp built for AVX2 without AVX-512 or
# AVX-VNNI (the EPYC host's instruction sets) on this Intel host: both llama-cpp-python (a venv
# of its own, PY) and llama.cpp's peers (build_peers.py) get the same CMAKE_ARGS. Not an EPYC
# host (its caches, memory and clocks differ): it separates the kernels from the rest.
#   CMAKE_ARGS="$(cat args.txt)" PIPEINFER_VENV=/work/venv-avx2 bash install.sh
#   CMAKE_ARGS="$(cat args.txt)" /work/venv-avx2/bin/python experiments/build_peers.py
cd "$(dirname "$0")/../../.."
OUT=experiments/reference/avx2-2026-11-27
export CMAKE_ARGS="$(cat $OUT/args.txt)"
PY=${PY:-/work/venv-avx2/bin/python}
BENCH=$($PY experiments/build_peers.py --where)/llama-bench
TARGET=~/.cache/pipeinfer/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
DRAFT=$(ls ~/.cache/pipeinfer/draft-vocab/*-k32768-v1.gguf | head -1)
hostfig() { echo "$BENCH"; flock /tmp/cpu.lock $BENCH -m $TARGET -t 1 -p 0 -n 32 -r 3 2>&1 | grep -E 'tg32'; }
{ date; hostfig; flock /tmp/cpu.lock $BENCH -m $DRAFT -t 1 -p 1,2,4,8 -n 0 -r 3 2>&1 | grep -E ' pp'; } > $OUT/llama-bench.txt
flock /tmp/cpu.lock $PY experiments/bench_peers.py --nodes 4,8 -n 128 -k ${K:-3} --draft-max 8 \
    --systems llama-rpc,llama-rpc-spec,iterative,pipeinfer --out $OUT/peers.csv > $OUT/peers.txt 2>&1
{ date; hostfig; } >> $OUT/llama-bench.txt
