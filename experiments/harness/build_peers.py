#!/usr/bin/env python3
"""Build the programs a user would run instead of pipeinfer: llama.cpp's RPC server and its
main-host programs, from the `vendor/llama.cpp` of the pinned llama-cpp-python sdist (fetched
from PyPI, so the kernels are the ones pipeinfer's engine wraps), with -DGGML_RPC=ON and the
CPU flags install.sh uses (native/cpu_cmake_args.sh).

    python experiments/build_peers.py            # prints the directory holding the binaries

The binaries are cached outside the repository, keyed by version and flags
($PIPEINFER_CACHE/peers/, default ~/.cache/pipeinfer/peers/); a second run builds nothing.
About 15 minutes on two cores the first time. Exit code 2 with one line saying why when a tool
is missing or the build fails (the log's path is in that line).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from . import ROOT
# The binaries bench_peers.py runs: target name -> file name (they agree in this version).
PEERS = ("ggml-rpc-server", "llama-completion", "llama-speculative", "llama-server", "llama-bench")


class BuildError(RuntimeError):
    pass


def cache_root() -> Path:
    base = os.environ.get("PIPEINFER_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "pipeinfer")
    return Path(base)


def llama_version() -> str:
    text = (ROOT / "pyproject.toml").read_text()
    found = re.search(r'"llama-cpp-python==([0-9.]+)"', text)
    if not found:
        raise BuildError("pyproject.toml pins no llama-cpp-python version")
    return found.group(1)


def cmake_args() -> str:
    if os.environ.get("CMAKE_ARGS"):
        return os.environ["CMAKE_ARGS"]
    out = subprocess.run(["bash", str(ROOT / "native" / "cpu_cmake_args.sh")],
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def peer_dir(version: str | None = None, args: str | None = None) -> Path:
    """Where the binaries of this version and these flags live (built or not)."""
    version = version or llama_version()
    args = cmake_args() if args is None else args
    key = hashlib.sha256(f"{version} {args}".encode()).hexdigest()[:16]
    return cache_root() / "peers" / f"llama.cpp-{version}-{key}"


def built(directory: Path) -> bool:
    return all((directory / "bin" / name).is_file() for name in PEERS)


def _check_tools() -> None:
    missing = [tool for tool in ("cmake", "make") if shutil.which(tool) is None]
    if not (shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")):
        missing.append("a C++ compiler (g++ or clang++)")
    if missing:
        raise BuildError("cannot build llama.cpp's peers: missing " + ", ".join(missing))


def fetch_sdist(version: str) -> Path:
    """The sdist, downloaded by pip (so its index settings apply), kept beside the builds."""
    folder = cache_root() / "sdists"
    found = sorted(folder.glob(f"llama_cpp_python-{version}.tar.gz"))
    if found:
        return found[0]
    folder.mkdir(parents=True, exist_ok=True)
    print(f"build_peers: downloading the llama-cpp-python {version} sdist", file=sys.stderr)
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                           "--no-binary", ":all:", "-d", str(folder),
                           f"llama-cpp-python=={version}"], capture_output=True, text=True)
    found = sorted(folder.glob(f"llama_cpp_python-{version}.tar.gz"))
    if done.returncode != 0 or not found:
        tail = (done.stderr.strip().splitlines() or ["no sdist downloaded"])[-1]
        raise BuildError(f"cannot download the llama-cpp-python {version} sdist: {tail}")
    return found[0]


def _extract_vendor(sdist: Path, into: Path) -> Path:
    shutil.rmtree(into, ignore_errors=True)
    into.mkdir(parents=True)
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if "/vendor/llama.cpp/" in m.name]
        tar.extractall(into, members=members, filter="data")
    found = next(into.glob("*/vendor/llama.cpp"), None)
    if found is None:
        raise BuildError(f"{sdist.name} holds no vendor/llama.cpp")
    return found


def _run(cmd: list[str], log: Path, what: str) -> None:
    with open(log, "a") as out:
        out.write("$ " + " ".join(cmd) + "\n")
        out.flush()
        done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] or [""]
        raise BuildError(f"{what} failed (exit {done.returncode}): {tail[0]}; log: {log}")


def build(jobs: int) -> Path:
    version, args = llama_version(), cmake_args()
    directory = peer_dir(version, args)
    if built(directory):
        return directory
    _check_tools()
    work = directory.with_name(directory.name + ".build")
    work.mkdir(parents=True, exist_ok=True)
    log = work / "build.log"
    log.write_text(f"llama.cpp {version} (llama-cpp-python sdist), CMAKE_ARGS={args}\n")
    source = _extract_vendor(fetch_sdist(version), work / "src")
    print(f"build_peers: building llama.cpp of llama-cpp-python {version} (log: {log})",
          file=sys.stderr)
    configure = ["cmake", "-S", str(source), "-B", str(work / "cmake"),
                 "-DCMAKE_BUILD_TYPE=Release", "-DGGML_RPC=ON", "-DBUILD_SHARED_LIBS=OFF",
                 "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", *args.split()]
    _run(configure, log, "cmake configure")
    for target in PEERS:
        print(f"build_peers: {target}", file=sys.stderr)
        _run(["cmake", "--build", str(work / "cmake"), "-j", str(jobs), "--target", target],
             log, f"building {target}")
    (directory / "bin").mkdir(parents=True, exist_ok=True)
    for name in PEERS:
        shutil.copy2(work / "cmake" / "bin" / name, directory / "bin" / name)
    (directory / "BUILD").write_text(f"llama-cpp-python {version}\nCMAKE_ARGS={args}\n")
    shutil.rmtree(work, ignore_errors=True)
    return directory


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 2,
                        help="parallel compile jobs (default: the CPU count)")
    parser.add_argument("--where", action="store_true",
                        help="print where the binaries would be and exit 1 if not built")
    args = parser.parse_args(argv)
    try:
        if args.where:
            directory = peer_dir()
            print(directory / "bin")
            return 0 if built(directory) else 1
        print(build(args.jobs) / "bin")
    except BuildError as err:
        print(f"build_peers: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
