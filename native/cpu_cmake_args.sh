#!/usr/bin/env bash
# Print the CMake arguments that build llama.cpp for the instruction sets this CPU really has:
# AMX off (some CPUs and VMs report AMX without working tiles, and that build crashes on the
# first decode), every other x86 extension the CPU lists on, repacking left on. Used by
# install.sh (the llama-cpp-python wheel) and experiments/build_peers.py (llama.cpp's own
# binaries), so both builds run the same kernels.
set -euo pipefail
flags=" $(grep -m1 -E '^(flags|Features)' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "
args="-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
for pair in avx:AVX avx2:AVX2 fma:FMA f16c:F16C bmi2:BMI2 sse4_2:SSE42 avx_vnni:AVX_VNNI \
            avx512f:AVX512 avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16 avx512vbmi:AVX512_VBMI; do
    case "$flags" in *" ${pair%%:*} "*) args="$args -DGGML_${pair#*:}=ON";; esac
done
# Not x86 (no such flags): let llama.cpp pick for this CPU itself.
case "$flags" in *" sse4_2 "*) ;; *) args="-DGGML_NATIVE=ON";; esac
echo "$args"
