"""The head-to-head against llama.cpp's RPC backend (experiments/bench_peers.py): reading what
llama.cpp's programs print (outputs captured from real runs, tests/data/peers), the build's
refusal without tools, a peer that crashes or hangs, and a smoke run of the whole bench with
the smallest model on 2 nodes when the peer binaries are built (experiments/build_peers.py;
skipped otherwise: building them takes about 15 minutes)."""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parent / "data" / "peers"
sys.path.insert(0, str(ROOT / "experiments"))
import bench_peers  # noqa: E402
import build_peers  # noqa: E402
from peer_output import PeerOutputError, parse_completion, parse_speculative  # noqa: E402

from test_cluster import _why_no_cgroups  # noqa: E402


def test_completion_output_is_read():
    r = parse_completion((DATA / "llama-completion.stderr.txt").read_text())
    assert r["n_prompt"] == 40 and r["n_generated"] == 16
    assert r["speed_tps"] == pytest.approx(47.54)
    assert r["itl_s"] == pytest.approx(0.02103)
    assert r["ttft_s"] == pytest.approx(0.27424)
    assert r["accept_rate"] is None


def test_speculative_output_is_read():
    r = parse_speculative((DATA / "llama-speculative.stderr.txt").read_text())
    assert r["n_prompt"] == 40 and r["n_generated"] == 21
    assert r["speed_tps"] == pytest.approx(30.745)
    assert r["ttft_s"] == pytest.approx(0.480)
    assert (r["n_drafted"], r["n_accepted"], r["accept_rate"]) == (16, 16, 1.0)


@pytest.mark.parametrize("parse, name", [(parse_completion, "llama-completion"),
                                         (parse_speculative, "llama-speculative")])
def test_cut_output_says_what_is_missing(parse, name):
    text = (DATA / f"{name}.stderr.txt").read_text()
    cut = text[:text.index("prompt eval time" if name == "llama-completion" else "decoded")]
    with pytest.raises(PeerOutputError, match="format changed"):
        parse(cut)


def test_build_without_tools_is_one_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PIPEINFER_CACHE", str(tmp_path))
    monkeypatch.setenv("CMAKE_ARGS", "-DGGML_NATIVE=ON")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(build_peers.BuildError, match="missing cmake, make, a C\\+\\+ compiler"):
        build_peers.build(jobs=1)
    # the bench goes on without them: its pipeinfer rows still run
    assert bench_peers.peer_binaries(["llama-rpc", "iterative"]) is None
    assert "the pipeinfer rows still run" in capsys.readouterr().err
    assert bench_peers.peer_binaries(["iterative"]) is None  # no peers asked: no build


def _real_cache(session_cache: Path) -> Path:
    return (session_cache / "models").resolve().parent


@pytest.fixture()
def peer_bin(session_cache, monkeypatch) -> Path:
    monkeypatch.setenv("PIPEINFER_CACHE", str(_real_cache(session_cache)))
    directory = build_peers.peer_dir()
    if not build_peers.built(directory):
        pytest.skip(f"llama.cpp peers not built ({directory}): python experiments/build_peers.py")
    why = _why_no_cgroups()
    if why:
        pytest.skip(why)
    return directory / "bin"


def _cluster_run(bin_dir: Path, command: list[str], timeout: float):
    from cpu_quota import PERIOD_US, CpuQuotas
    from peers import PeerCluster
    quotas = CpuQuotas(uuid.uuid4().hex[:6], [1.0, 1.0], PERIOD_US)
    quotas.create()
    try:
        with PeerCluster(bin_dir, quotas) as cluster:
            return cluster.run(command + ["--rpc", cluster.endpoints()], timeout)
    finally:
        quotas.remove()


def test_built_peers_are_not_rebuilt(peer_bin, monkeypatch, tmp_path):
    """A second run finds the cached binaries and builds nothing: without cmake, make or a
    compiler on PATH (only what reads the CPU flags) it still answers."""
    for tool in ("bash", "grep", "cut"):
        (tmp_path / tool).symlink_to(shutil.which(tool))
    monkeypatch.setenv("PATH", str(tmp_path))
    assert build_peers.build(jobs=1) / "bin" == peer_bin


def test_crashing_peer_says_why(peer_bin, tmp_path):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 64)
    run = _cluster_run(peer_bin, [str(peer_bin / "llama-completion"), "-m", str(broken),
                                  "-p", "hi", "-n", "4", "-no-cnv"], timeout=60)
    assert run.error and run.error.startswith("exit ")
    assert "(no output)" not in run.error  # the program's own last line


def test_hanging_peer_is_killed(peer_bin, smollm2):
    run = _cluster_run(peer_bin, [str(peer_bin / "llama-completion"), "-m", str(smollm2),
                                  "-p", "Once", "-n", "100000", "--ignore-eos", "-no-cnv",
                                  "-t", "1"], timeout=4)
    assert run.error and run.error.startswith("hung: killed after 4 s")


def test_bench_smoke_two_nodes(peer_bin, smollm2, session_cache, tmp_path):
    out = tmp_path / "peers.csv"
    env = dict(os.environ, PIPEINFER_CACHE=str(_real_cache(session_cache)))
    done = subprocess.run(
        [sys.executable, str(ROOT / "experiments" / "bench_peers.py"), "--model", "smollm2",
         "--draft", "smollm2", "--nodes", "2", "-k", "1", "-n", "8", "--draft-max", "2",
         "--systems", "llama-rpc,llama-rpc-spec,pipeinfer", "--out", str(out)],
        capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = list(csv.DictReader(open(out)))
    assert [r["label"].rsplit("=", 1)[1] for r in rows] == \
        ["llama-rpc", "llama-rpc-spec-d2", "pipeinfer"]
    for r in rows:
        assert r["error"] == "" and float(r["speed_tps"]) > 0
        assert int(r["n_generated"]) >= 8 and int(r["n_prompt"]) == 40  # same prompt tokens
        assert len(r["peak_rss_mb"].split(",")) == 2
    assert "pipeinfer / best peer" in done.stdout
    figures = tmp_path / "figures"
    plot = subprocess.run([sys.executable, str(ROOT / "plot.py"), str(out), "--out",
                           str(figures)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert plot.returncode == 0, plot.stderr
    assert (figures / "peers.png").stat().st_size > 0
