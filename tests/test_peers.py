"""The head-to-head against llama.cpp's RPC backend (experiments/bench_peers.py): reading what
llama.cpp's programs print (outputs captured from real runs, tests/data/peers), the build's
refusal without tools, a peer that crashes or hangs, and a smoke run of the whole bench with
the smallest model on 2 nodes when the peer binaries are built (experiments/harness/build_peers.py;
skipped otherwise: building them takes about 15 minutes)."""

from __future__ import annotations

import csv
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from experiments import bench_peers
from experiments.harness import bench_runs, build_peers
from experiments.harness.peer_output import PeerOutputError, parse_completion, parse_speculative
from support.cluster import why_no_cgroups

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parent / "data" / "peers"


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
        pytest.skip(f"llama.cpp peers not built ({directory}): python -m experiments.harness.build_peers")
    why = why_no_cgroups()
    if why:
        pytest.skip(why)
    return directory / "bin"


def _cluster_run(bin_dir: Path, command: list[str], timeout: float):
    from experiments.harness.cpu_quota import CpuQuotas
    from experiments.harness.peers import PeerCluster
    quotas = CpuQuotas(uuid.uuid4().hex[:6], [1.0, 1.0])
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


def test_crashing_peer_says_why(peer_bin):
    """A main program that fails is an error row with its last stderr line. The failure is a
    bad argument value, which llama.cpp prints with fprintf before it exits: its other errors
    go through common/log.cpp's logging thread, whose queue an early exit may drop (the logger
    is leaked on purpose upstream), so their text is not always there to read."""
    run = _cluster_run(peer_bin, [str(peer_bin / "llama-completion"), "-m", "unused.gguf",
                                  "-n", "four", "-no-cnv"], timeout=60)
    assert run.error and run.error.startswith("exit ")
    assert "(no output)" not in run.error and "run with -h" in run.error  # its own words
    assert 'handling argument "-n"' in run.stderr


def test_broken_model_is_an_error_not_a_hang(peer_bin, tmp_path):
    """A model file llama.cpp cannot load ends the run at once with its exit code (the words
    may be lost, see above): the row says so, not nothing."""
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 64)
    run = _cluster_run(peer_bin, [str(peer_bin / "llama-completion"), "-m", str(broken),
                                  "-p", "hi", "-n", "4", "-no-cnv"], timeout=60)
    assert run.returncode not in (0, None) and run.error.startswith("exit ")
    assert "(no output)" not in run.error   # its last line, or why there is none


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
    table = out.with_suffix(".md").read_text()   # the results page's table, beside the CSV
    assert "| 2 x 1 core |" in table and "pipeinfer / best peer" in table
    assert out.with_suffix(".png").stat().st_size > 0
    out.with_suffix(".md").unlink()
    replot = subprocess.run([sys.executable, str(ROOT / "experiments" / "bench_peers.py"),
                             "--replot", str(out)], capture_output=True, text=True, timeout=300)
    assert replot.returncode == 0, replot.stderr
    assert out.with_suffix(".md").read_text() == table


def _write_peer_rows(path: Path, rows: list[tuple[str, int, float, float, str]]) -> None:
    """bench_peers CSV rows: (variant, nodes, cores each, t/s, peak RSS per node)."""
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["strategy", "ranks", "speed_tps", "peak_rss_mb", "error", "label"])
        for variant, nodes, cpu, tps, rss in rows:
            writer.writerow([variant, nodes, tps, rss, "",
                             f"pair=p;prompt=code;setting={nodes}n-{cpu:g}c;variant={variant}"])


def test_replot_draws_the_table_and_charts_from_a_csv(tmp_path):
    """--replot: medians per system and node count, llama.cpp's speculative decoding at its
    best draft max, the ratios, each node's memory; a chart for each; nothing is run."""
    out = tmp_path / "peers.csv"
    _write_peer_rows(out, [("llama-rpc", 4, 0.5, tps, "1300,340,330,450") for tps in (3.0, 3.2, 3.1)]
                     + [("llama-rpc-spec-d4", 4, 0.5, 2.0, ""), ("llama-rpc-spec-d8", 4, 0.5, 2.5, "")]
                     + [("pipeinfer", 4, 0.5, tps, "530,360,350,490") for tps in (6.0, 6.4, 6.2)]
                     + [("pipeinfer", 8, 0.25, 4.0, "530,200,190,190,190,190,190,350")])
    done = subprocess.run([sys.executable, str(ROOT / "experiments" / "bench_peers.py"),
                           "--replot", str(out), "--memory"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    table = out.with_suffix(".md").read_text().splitlines()
    assert table[0].startswith("| nodes | llama.cpp RPC | RPC + its spec (best) | pipeinfer |")
    assert table[2] == ("| 4 x 0.5 core | 3.10 (3.00 / 3.20 / 3.10) | 2.50 (2.50) d8 | "
                        "6.20 (6.00 / 6.40 / 6.20) | **2.00x** | - |")
    assert table[3].startswith("| 8 x 0.25 core | - | - | 4.00 (4.00) |")
    memory = (tmp_path / "peers-memory.md").read_text()
    assert "| 4 | llama.cpp RPC | 1300 / 340 / 330 / 450 |" in memory
    for png in ("peers.png", "peers-memory.png"):
        assert (tmp_path / png).read_bytes().startswith(b"\x89PNG")


def _emulation_leftovers(marker: str) -> tuple[set[str], set[int]]:
    """The emulation's cgroups now, and the processes whose command line holds `marker`."""
    from experiments.harness.cpu_quota import controller
    cgroups = {p.name for p in controller()[0].glob("pipeinfer-*")}
    found = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True)
    return cgroups, {int(pid) for pid in found.stdout.split()}


def _wait_gone(marker: str, before: tuple[set[str], set[int]],
               seconds: float = 15) -> tuple[set[str], set[int]]:
    """The cgroups and `marker` processes of a stopped run still there (beyond `before`) once
    they had `seconds` to go (an exited rpc-server is reaped by init, not at once)."""
    deadline = time.monotonic() + seconds
    while True:
        cgroups, pids = _emulation_leftovers(marker)
        left = (cgroups - before[0], pids - before[1])
        if left == (set(), set()) or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def test_a_hung_pipeinfer_run_is_stopped_with_its_cluster(smollm2, session_cache, monkeypatch):
    """A run past its timeout gets SIGTERM, so cluster.py takes down its job and cgroups
    (SIGKILL, as subprocess.run sends, left the ranks running and the cgroups behind)."""
    why = why_no_cgroups()
    if why:
        pytest.skip(why)
    monkeypatch.setenv("PIPEINFER_CACHE", str(_real_cache(session_cache)))
    marker = f"Once upon a time {uuid.uuid4().hex}"
    before = _emulation_leftovers(marker)
    spec = bench_runs.RunSpec(system="iterative", variant="iterative", nodes=2, cpu=1.0,
                              model=str(smollm2), draft="", prompt=marker, n=3000, timeout=8)
    r = bench_runs.run_pipeinfer(spec)
    assert r["error"] == "hung: stopped after 8 s", r
    assert _wait_gone(marker, before) == (set(), set())


def test_bench_stopped_by_sigterm_leaves_nothing_behind(peer_bin, smollm2, session_cache,
                                                        tmp_path):
    """SIGTERM in the middle of a llama.cpp RPC run: the bench ends (143) and takes the
    rpc-servers, the main program and the nodes' cgroups with it, as Ctrl-C does."""
    env = dict(os.environ, PIPEINFER_CACHE=str(_real_cache(session_cache)))
    before = _emulation_leftovers("ggml-rpc-server|llama-completion")
    bench = subprocess.Popen(
        [sys.executable, str(ROOT / "experiments" / "bench_peers.py"), "--model", "smollm2",
         "--nodes", "2", "-k", "1", "-n", "3000", "--systems", "llama-rpc",
         "--out", str(tmp_path / "stopped.csv")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (
                _emulation_leftovers("llama-completion")[1] - before[1]):
            time.sleep(0.2)
        assert _emulation_leftovers("llama-completion")[1] - before[1], "the run never started"
        time.sleep(2)
        bench.send_signal(signal.SIGTERM)
        out, err = bench.communicate(timeout=60)
    finally:
        if bench.poll() is None:
            bench.kill()
    assert bench.returncode == 143, err[-2000:]
    assert _wait_gone("ggml-rpc-server|llama-completion", before) == (set(), set())
