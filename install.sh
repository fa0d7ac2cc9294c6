#!/usr/bin/env bash
# Install pipeinfer with a llama.cpp build suited to this CPU.
#
# Usage: bash install.sh [EXTRAS]      (EXTRAS e.g. "test"; default none)
#
# Why this script exists: llama-cpp-python is built from source by pip, and its default build
# uses -march=native. On CPUs (or VMs) that report AMX without working AMX tiles that build
# crashes on the first decode, and the runtime escape (no extra buffer types) also disables the
# weight repacking that makes small verification batches cheap. So we build llama.cpp with the
# instruction sets this CPU really has, AMX off, repacking on; the wheel is cached outside the
# repository (keyed by version and flags), so later installs on this machine take seconds.
#
# Environment: PIPEINFER_VENV (default ./.venv; "none" = use the active Python as is),
#              PIPEINFER_CACHE (default ~/.cache/pipeinfer), CMAKE_ARGS (overrides detection).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
extras=${1:-}
llama_version=$(sed -n 's/.*"llama-cpp-python==\([0-9.]*\)".*/\1/p' "$here/pyproject.toml")
cache=${PIPEINFER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pipeinfer}

venv=${PIPEINFER_VENV:-$here/.venv}
if [ "$venv" != none ]; then
    [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
    py="$venv/bin/python"
else
    py=python3
fi

args=${CMAKE_ARGS:-$(bash "$here/native/cpu_cmake_args.sh")}
key=$(printf '%s %s' "$llama_version" "$args" | sha256sum | cut -c1-16)
wheeldir="$cache/wheels/llama-cpp-python-$llama_version-$key"
"$py" -m pip install --quiet --upgrade pip
if ! ls "$wheeldir"/llama_cpp_python-*.whl >/dev/null 2>&1; then
    echo "install.sh: building llama-cpp-python $llama_version for this CPU (about 10 minutes, once)" >&2
    echo "install.sh: CMAKE_ARGS=$args" >&2
    mkdir -p "$wheeldir.tmp"
    CMAKE_ARGS="$args" "$py" -m pip wheel --no-deps --no-cache-dir --no-binary llama-cpp-python \
        -w "$wheeldir.tmp" "llama-cpp-python==$llama_version"
    rm -rf "$wheeldir"; mv "$wheeldir.tmp" "$wheeldir"
fi
"$py" -m pip install --quiet "$wheeldir"/llama_cpp_python-*.whl
"$py" -m pip install --quiet -e "$here${extras:+[$extras]}"
echo "install.sh: done; activate with: source ${venv/#$here\//}/bin/activate" >&2
