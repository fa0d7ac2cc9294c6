"""Weights travel with the job (issue 31): on emulated machines with disks of their own
(experiments/cluster.py --disks private: only node 0 sees the model files), every other rank
receives its slice from rank 0 over MPI, the output stays exactly llama.cpp's, a second start
transfers nothing, and every fault ends the job with one clear error, leaving nothing that a
later start would trust. Real mpiexec, real ranks, real files."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from support import fault_env
from support.cluster import CLUSTER, needs_cgroups
from support.llama_oracle import llama_greedy
from support.mpi_util import PYTHON, launch, mpi_env, run_args, run_pipeinfer

pytestmark = pytest.mark.slow



PROMPT = "def main():\n    return"
N = 12
SPLIT = "0.2,0.4,0.4"


@pytest.fixture(scope="module")
def tiny8(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from support.tinymodel import write_tiny_llama

    return write_tiny_llama(tmp_path_factory.mktemp("weights-models") / "tiny8.gguf",
                            n_layer=8, seed=7)


def private(disks: Path, model, *extra: str, nodes: int = 3, split: str = SPLIT,
            env: dict | None = None, timeout: float = 120, hide=(), prompt=PROMPT, n=N):
    """`pipeinfer run` on `nodes` emulated machines, node 0 the only one with the model."""
    cmd = [str(PYTHON), str(CLUSTER), "--nodes", str(nodes), "--cpu", "1", "--disks",
           "private", "--disk-root", str(disks)]
    for path in hide:
        cmd += ["--hide", str(path)]
    cmd += ["--", *run_args(model, prompt, "--layer-split", split, *extra, n_predict=n)]
    return launch(cmd, timeout=timeout, env=mpi_env(env))


def ok(result) -> dict:
    assert result.rc == 0 and not result.timed_out, result.describe()
    assert result.json is not None and "Traceback" not in result.stderr, result.describe()
    return result.json


def node_files(disks: Path, node: int) -> list[Path]:
    return sorted((disks / f"node{node}" / "cache" / "stages").glob("*.gguf*"))


@needs_cgroups
def test_slices_travel_and_stay_exact(tmp_path: Path, tiny8: Path):
    disks = tmp_path / "disks"
    first = ok(private(disks, tiny8))
    received = first["weights_received_bytes"]
    sizes = [sum(f.stat().st_size for f in node_files(disks, r)) for r in (1, 2)]
    assert received[0] == 0 and received[1:] == sizes and min(sizes) > 0, received
    assert first["tokens"] == llama_greedy(tiny8, first["prompt_tokens"], N)
    second = ok(private(disks, tiny8))
    assert second["weights_received_bytes"] == [0, 0, 0]
    assert second["tokens"] == first["tokens"]



@needs_cgroups
def test_draft_rank_receives_its_model(tmp_path: Path, tiny8: Path):
    """A draft model on a rank of its own (`/1`) travels like a slice: rank 2 receives the
    whole draft file, a second start transfers nothing, the output is llama.cpp's."""
    from support.tinymodel import write_tiny_llama

    draft = write_tiny_llama(tmp_path / "draft.gguf", n_layer=2, seed=3)
    disks = tmp_path / "disks"
    args = ("-md", str(draft), "--strategy", "pipespec", "--no-compact-draft")
    first = ok(private(disks, tiny8, *args, split="0,1/1"))
    received = first["weights_received_bytes"]
    assert received[0] == 0 and received[2] == draft.stat().st_size, received
    assert received[1] == sum(f.stat().st_size for f in node_files(disks, 1)) > 0
    assert first["tokens"] == llama_greedy(tiny8, first["prompt_tokens"], N)
    second = ok(private(disks, tiny8, *args, split="0,1/1"))
    assert second["weights_received_bytes"] == [0, 0, 0]
    assert second["tokens"] == first["tokens"]

@needs_cgroups
@pytest.mark.smollm2
def test_smollm2_without_model_on_workers_is_exact(tmp_path: Path, smollm2: Path):
    result = ok(private(tmp_path / "disks", smollm2, split="0.2,0.4,0.4",
                        prompt="The capital of France is", n=16, timeout=300))
    assert all(b > 0 for b in result["weights_received_bytes"][1:])
    assert result["tokens"] == llama_greedy(smollm2, result["prompt_tokens"], 16)


@needs_cgroups
def test_corrupt_chunk_is_sent_again(tmp_path: Path, tiny8: Path):
    """The first transfer arrives with a flipped byte: discarded, sent once more, exact."""
    disks = tmp_path / "disks"
    result = private(disks, tiny8, env=fault_env(TEST_CORRUPT_CHUNK="0:1"))
    out = ok(result)
    assert "arrived corrupt" in result.stderr
    sizes = [sum(f.stat().st_size for f in node_files(disks, r)) for r in (1, 2)]
    assert sorted(b / s for b, s in zip(out["weights_received_bytes"][1:], sizes)) == [1, 2]
    assert out["tokens"] == llama_greedy(tiny8, out["prompt_tokens"], N)


@needs_cgroups
def test_corrupt_twice_fails_cleanly(tmp_path: Path, tiny8: Path):
    disks = tmp_path / "disks"
    result = private(disks, tiny8, nodes=2, split="0.5,0.5", timeout=60,
                     env=fault_env(TEST_CORRUPT_CHUNK="0:2"))
    assert result.rc != 0 and not result.timed_out, result.describe()
    assert "rank 1 (" in result.stderr and "corrupt twice" in result.stderr, result.describe()
    assert "Traceback" not in result.stderr
    assert node_files(disks, 1) == []  # nothing kept, not even a part file


@needs_cgroups
def test_unwritable_cache_names_rank_host_and_path(tmp_path: Path, tiny8: Path):
    disks = tmp_path / "disks"
    stages = disks / "node2" / "cache" / "stages"
    stages.parent.mkdir(parents=True)
    stages.write_text("a file where the stage cache should be")
    t0 = time.monotonic()
    result = private(disks, tiny8, timeout=60)
    assert result.rc != 0 and not result.timed_out, result.describe()
    lines = [line for line in result.stderr.splitlines() if "error" in line]
    assert any("rank 2 (" in line and str(stages) in line for line in lines), result.describe()
    assert "Traceback" not in result.stderr
    assert time.monotonic() - t0 < 60


def _rank0_pids(marker: str) -> list[int]:
    """pipeinfer processes of rank 0 (the supervisor and the rank) whose command has marker."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker in cmd and "pipeinfer run" in cmd and b"PMI_RANK=0" in env:
            pids.append(int(entry.name))
    return pids


@needs_cgroups
def test_interrupted_transfer_leaves_nothing_trusted(tmp_path: Path, tiny8: Path):
    """Rank 0 killed mid-transfer: the job ends, the receiver keeps no stage file; the next
    start sends it whole and runs exact."""
    disks = tmp_path / "disks"
    model = tmp_path / "interrupted.gguf"
    shutil.copy(tiny8, model)
    cmd = [str(PYTHON), str(CLUSTER), "--nodes", "2", "--cpu", "1", "--disks", "private",
           "--disk-root", str(disks), "--", *run_args(model, PROMPT, "--layer-split", "0.5,0.5",
                                                     n_predict=N)]
    env = mpi_env(fault_env(PIPEINFER_WEIGHTS_CHUNK="4096", TEST_CHUNK_DELAY="0.05"))
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not any(".part" in f.name for f in node_files(disks, 1)):
            assert time.monotonic() < deadline and proc.poll() is None, "no transfer started"
            time.sleep(0.1)
        time.sleep(0.5)
        for pid in _rank0_pids(str(model)):
            os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0
    assert [f for f in node_files(disks, 1) if f.suffix == ".gguf"] == []
    again = ok(private(disks, model, nodes=2, split="0.5,0.5"))
    assert again["weights_received_bytes"][1] > 0
    assert [f.suffix for f in node_files(disks, 1)] == [".gguf"]  # the stale part is gone
    assert again["tokens"] == llama_greedy(model, again["prompt_tokens"], N)


@needs_cgroups
@pytest.mark.smollm2
def test_worker_copy_used_unless_it_differs(tmp_path: Path, smollm2: Path):
    """A worker with rank 0's model under the same name cuts its slice itself; one whose copy
    differs says so and receives its slice."""
    disks = tmp_path / "disks"
    for node, flip in ((1, True), (2, False)):
        models = disks / f"node{node}" / "cache" / "models"
        models.mkdir(parents=True)
        copy = models / smollm2.name
        shutil.copy(smollm2, copy)
        if flip:
            with open(copy, "r+b") as f:
                f.seek(-1, os.SEEK_END)
                last = f.read(1)
                f.seek(-1, os.SEEK_END)
                f.write(bytes([last[0] ^ 0xFF]))
    result = private(disks, "smollm2", hide=[smollm2.parent], prompt="The capital of France is",
                     n=16, timeout=300)
    out = ok(result)
    assert out["weights_received_bytes"][1] > 0 and out["weights_received_bytes"][2] == 0
    assert "differs from rank 0's" in result.stderr
    assert out["tokens"] == llama_greedy(smollm2, out["prompt_tokens"], 16)


def test_rank0_without_model_is_one_clear_error(tmp_path: Path):
    result = run_pipeinfer(2, tmp_path / "missing.gguf", PROMPT, timeout=60)
    assert result.rc != 0 and not result.timed_out, result.describe()
    assert "model file not found" in result.stderr and "Traceback" not in result.stderr


@needs_cgroups
def test_calibrate_and_auto_split_without_model_on_workers(tmp_path: Path, tiny8: Path):
    """`calibrate` and `run --layer-split auto` time slices the workers receive."""
    disks = tmp_path / "disks"
    cmd = [str(PYTHON), str(CLUSTER), "--nodes", "3", "--cpu", "1", "--disks", "private",
           "--disk-root", str(disks), "--"]
    env = mpi_env({"PIPEINFER_CACHE": str(tmp_path / "cache0")})
    from support.mpi_util import PIPEINFER

    calibrated = launch(cmd + [str(PIPEINFER), "calibrate", "-m", str(tiny8), "--profile",
                               str(tmp_path / "profile.json")], timeout=180, env=env)
    assert calibrated.rc == 0 and "profile:" in calibrated.stdout, calibrated.describe()
    assert any(node_files(disks, r) for r in (1, 2))
    auto = launch(cmd + run_args(tiny8, PROMPT, "--layer-split", "auto", n_predict=N),
                  timeout=180, env=env)
    out = ok(auto)
    assert out["tokens"] == llama_greedy(tiny8, out["prompt_tokens"], N)


@needs_cgroups
def test_full_disk_names_rank_host_and_space(tmp_path: Path, tiny8: Path):
    """A worker whose disk has no room for its slice: one error naming rank, host, path."""
    disks = tmp_path / "disks"
    stages = disks / "node1" / "cache" / "stages"
    stages.mkdir(parents=True)
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "none", str(stages)],
                           capture_output=True, text=True)
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs: {mount.stderr.strip()}")
    try:
        result = private(disks, tiny8, timeout=60)
    finally:
        subprocess.run(["umount", str(stages)], capture_output=True)
    assert result.rc != 0 and not result.timed_out, result.describe()
    lines = [line for line in result.stderr.splitlines() if "error" in line]
    assert any("rank 1 (" in line and "not enough space" in line and str(stages) in line
               for line in lines), result.describe()
    assert "Traceback" not in result.stderr


@needs_cgroups
@pytest.mark.smollm2
def test_serve_without_model_on_workers_is_exact(tmp_path: Path, smollm2: Path):
    """`serve` starts the same way: the workers receive their slices, answers stay exact."""
    import httpx

    from support.serving import Server

    launcher = [str(PYTHON), str(CLUSTER), "--nodes", "3", "--cpu", "1", "--disks", "private",
                "--disk-root", str(tmp_path / "disks"), "--"]
    srv = Server(tmp_path, 3, "-m", str(smollm2), "--layer-split", "0.2,0.4,0.4",
                 "--no-cache-prompt", launcher=launcher)
    try:
        srv.wait_ready(180)
        prompt = "The capital of France is"
        answer = httpx.post(srv.url + "/v1/completions", timeout=120, json={
            "prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True}).json()
        assert any(node_files(tmp_path / "disks", r) for r in (1, 2))
    finally:
        srv.proc.send_signal(signal.SIGTERM)  # cluster.py removes its cgroups and mounts
        try:
            srv.proc.wait(30)
        finally:
            srv.kill()
    from pipeinfer.model.tokenizer import Tokenizer

    tok = Tokenizer(smollm2)
    try:
        want = tok.detokenize(llama_greedy(smollm2, tok.tokenize(prompt), 12))
    finally:
        tok.close()
    assert answer["choices"][0]["text"] == want, answer


@needs_cgroups
def test_rank0_read_error_mid_transfer_ends_cleanly(tmp_path: Path, tiny8: Path):
    """Rank 0's disk fails while it streams a slice: the receiver is not left waiting for
    bytes that never come; one error says what rank 0 could not read; nothing is kept."""
    disks = tmp_path / "disks"
    t0 = time.monotonic()
    result = private(disks, tiny8, nodes=2, split="0.5,0.5", timeout=60,
                     env=fault_env(PIPEINFER_WEIGHTS_CHUNK="4096", TEST_READ_FAIL_CHUNK="3"))
    assert result.rc != 0 and not result.timed_out, result.describe()
    assert "cannot read" in result.stderr and "Traceback" not in result.stderr, \
        result.describe()
    assert node_files(disks, 1) == [] and time.monotonic() - t0 < 60
