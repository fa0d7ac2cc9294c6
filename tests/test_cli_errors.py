"""Errors of `pipeinfer run` under mpiexec: one clear line on stderr, a non-zero exit status
of the whole launch, no traceback and no hang. Uses mpiexec's MPMD form
(`mpiexec -n 1 A : -n 1 B`) to give one rank a different model file than the others."""

from __future__ import annotations

import socket
from pathlib import Path

import numpy as np
import pytest

from support.mpi_util import launch, mpmd_command, run_args, run_pipeinfer

TIMEOUT = 60
PROMPT = "def main():"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A good tiny model and broken variants of it (same metadata, so the same partition)."""
    from support.tinymodel import write_tiny_llama

    root = tmp_path_factory.mktemp("bad-models")
    good = write_tiny_llama(root / "good.gguf", n_layer=4, seed=3)
    data = good.read_bytes()
    truncated = root / "truncated.gguf"
    truncated.write_bytes(data[: len(data) * 2 // 3])
    return {"good": good, "truncated": truncated,
            "wrong_shape": _wrong_shape_copy(good, root / "wrong-shape.gguf", "blk.3.ffn_up.weight"),
            "missing": root / "no-such-dir" / "missing.gguf"}


def _wrong_shape_copy(src: Path, dst: Path, victim: str) -> Path:
    """Copy of `src` where tensor `victim` has a shape llama.cpp rejects at load time: the file
    is a well-formed GGUF (it passes pipeinfer's checks); only llama.cpp's loader refuses it."""
    from support.tinymodel import copy_gguf

    def wrong(t):
        if t.name != victim:
            return None
        data = np.array(t.data)
        return np.zeros((data.shape[0] + 8, data.shape[1]), dtype=data.dtype)

    return copy_gguf(src, dst, tensor=wrong)


@pytest.fixture
def cache_env(tmp_path: Path) -> dict:
    """Stage files of these throwaway models go to a temporary cache."""
    return {"PIPEINFER_CACHE": str(tmp_path / "cache")}


def assert_clean_failure(res, *fragments: str) -> str:
    """Non-zero exit, no hang, no traceback, exactly one error line containing `fragments`."""
    assert not res.timed_out, "the launch hung:\n" + res.describe()
    assert res.rc != 0, res.describe()
    assert "Traceback" not in res.stderr, res.describe()
    errors = [line for line in res.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1, res.describe()
    line = errors[0]
    assert line.startswith("pipeinfer: error: "), res.describe()
    for fragment in fragments:
        assert fragment in line, f"{fragment!r} not in {line!r}"
    assert res.json is None
    return line


# --- every rank has the same problem --------------------------------------------------------

def test_split_count_not_matching_ranks(models, cache_env) -> None:
    res = run_pipeinfer(2, models["good"], PROMPT, "--layer-split", "0.2,0.3,0.5",
                        timeout=TIMEOUT, env=cache_env)
    assert_clean_failure(res, "3 fractions", "2 ranks")


def test_split_count_single_rank(models, cache_env) -> None:
    res = run_pipeinfer(None, models["good"], PROMPT, "--layer-split", "0.5,0.5",
                        timeout=TIMEOUT, env=cache_env)
    assert_clean_failure(res, "2 fractions", "1 ranks")


def test_model_missing_everywhere(models, cache_env) -> None:
    res = run_pipeinfer(2, models["missing"], PROMPT, timeout=TIMEOUT, env=cache_env)
    assert_clean_failure(res, str(models["missing"]))


@pytest.mark.parametrize("n_ranks", [None, 2], ids=["plain", "mpiexec-2"])
def test_n_predict_zero(models, cache_env, n_ranks) -> None:
    res = run_pipeinfer(n_ranks, models["good"], PROMPT, n_predict=0, timeout=TIMEOUT,
                        env=cache_env)
    assert_clean_failure(res, "-n")


@pytest.mark.parametrize("n_ranks", [None, 3], ids=["plain", "mpiexec-3"])
def test_empty_prompt(models, cache_env, n_ranks) -> None:
    res = run_pipeinfer(n_ranks, models["good"], "", timeout=TIMEOUT, env=cache_env)
    assert_clean_failure(res, "empty")


@pytest.mark.parametrize("n_ranks", [None, 2], ids=["plain", "mpiexec-2"])
def test_prompt_longer_than_context(models, cache_env, n_ranks) -> None:
    prompt = "the quick brown fox jumps over the lazy dog " * 8
    res = run_pipeinfer(n_ranks, models["good"], prompt, "-c", "16", timeout=TIMEOUT,
                        env=cache_env)
    assert_clean_failure(res, "-c", "16")


# --- one rank differs (MPMD launch) ---------------------------------------------------------

def _mpmd(models, rank1_model: Path, env: dict):
    cmd = mpmd_command([(1, run_args(models["good"], PROMPT)),
                        (1, run_args(rank1_model, PROMPT))])
    return launch(cmd, timeout=TIMEOUT, env=env)


def _good_tokens(models, env) -> list[int]:
    res = _mpmd(models, models["good"], env)
    assert res.rc == 0 and res.json is not None, res.describe()
    return res.json["tokens"]


@pytest.mark.slow
def test_model_missing_on_one_rank(models, cache_env) -> None:
    """Only rank 0 needs the model: a worker whose -m does not exist takes rank 0's."""
    res = _mpmd(models, models["missing"], cache_env)
    assert res.rc == 0 and res.json is not None, res.describe()
    assert res.json["tokens"] == _good_tokens(models, cache_env)


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["truncated", "wrong_shape"])
def test_other_model_on_one_rank_is_replaced(models, tmp_path, variant) -> None:
    """A worker whose copy of the model is not rank 0's says so and receives its slice from
    rank 0 instead: the output is the good model's."""
    env0 = {"PIPEINFER_CACHE": str(tmp_path / "cache0")}
    cmd = mpmd_command([(1, ["env", f"PIPEINFER_CACHE={tmp_path / 'cache0'}",
                             *run_args(models["good"], PROMPT)]),
                        (1, ["env", f"PIPEINFER_CACHE={tmp_path / 'cache1'}",
                             *run_args(models[variant], PROMPT)])])
    res = launch(cmd, timeout=TIMEOUT)
    assert res.rc == 0 and res.json is not None, res.describe()
    assert "differs from rank 0's" in res.stderr, res.describe()
    assert res.json["weights_received_bytes"][1] > 0
    assert res.json["tokens"] == _good_tokens(models, env0)


@pytest.mark.slow
def test_stage_load_failure_on_one_rank(models, tmp_path) -> None:
    """Rank 1's cached slice holds a tensor llama.cpp refuses: the load error names the rank."""
    from pipeinfer.model.slicing import model_info, read_model, write_stage

    caches = [tmp_path / "cache0", tmp_path / "cache1"]
    cmd = mpmd_command([(1, ["env", f"PIPEINFER_CACHE={c}", *run_args(models["good"], PROMPT)])
                        for c in caches])
    assert launch(cmd, timeout=TIMEOUT).rc == 0
    (cached,) = (caches[1] / "stages").glob("*.gguf")  # rank 1's slice, by its key
    first, last = (int(x) for x in cached.stem.split("-")[2:4])
    from pipeinfer.model.partition import StageRange

    bad = models["wrong_shape"]
    write_stage(read_model(bad), model_info(read_model(bad), bad),
                StageRange(1, first, last, True), cached)
    res = launch(cmd, timeout=TIMEOUT)
    line = assert_clean_failure(res, "rank 1", socket.gethostname(), "could not load")
    assert "ffn_up" in line  # llama.cpp's own reason is passed on


def test_good_mpmd_launch_works(models, cache_env) -> None:
    """Control for the MPMD tests: the same launch with good files on both ranks succeeds."""
    res = _mpmd(models, models["good"], cache_env)
    assert res.rc == 0 and res.json is not None, res.describe()
    assert res.json["n_ranks"] == 2
