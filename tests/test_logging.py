"""What pipeinfer shows on stderr by verbosity: every module logs, cli.setup_logging decides
what shows and how (`pipeinfer[RANK]: ...` progress, `pipeinfer: ...` notices, `pipeinfer:
error: ...` errors); the generated text alone goes to stdout, whatever the verbosity."""

from __future__ import annotations

import logging
import re
import subprocess
from pathlib import Path

import pytest

from support.mpi_util import PIPEINFER, run_pipeinfer

PROMPT = "def main():"
N_PREDICT = 8
TIMEOUT = 90
PROGRESS = re.compile(r"^pipeinfer\[(\d+)\]: ", re.M)


def _run(model: Path, cache: Path, *flags: str, as_json: bool = False):
    # A cache of its own: every rank slices its stage, so every rank has a progress line.
    res = run_pipeinfer(2, model, PROMPT, "--ignore-eos", *flags, n_predict=N_PREDICT,
                        as_json=as_json, timeout=TIMEOUT, env={"PIPEINFER_CACHE": str(cache)})
    assert res.rc == 0 and not res.timed_out, res.describe()
    assert "Traceback" not in res.stderr, res.describe()
    return res


@pytest.fixture(scope="module")
def generated(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The text of the run, from --json (what stdout must hold, plus the final newline)."""
    res = _run(tiny_model, tmp_path_factory.mktemp("json-cache"), as_json=True)
    assert res.json is not None and res.json["n_generated"] == N_PREDICT, res.describe()
    return res.json["text"]


@pytest.mark.parametrize("flags, progress_ranks, summary", [
    (("-q",), set(), False),
    ((), {0}, True),
    (("-v",), {0, 1}, True),
], ids=["quiet", "default", "verbose"])
def test_stderr_by_verbosity(tiny_model, tmp_path, generated, flags, progress_ranks,
                             summary) -> None:
    res = _run(tiny_model, tmp_path / "cache", *flags)
    assert res.stdout == generated + "\n", res.describe()
    assert {int(r) for r in PROGRESS.findall(res.stderr)} == progress_ranks, res.describe()
    for rank in progress_ranks:  # each rank sliced its part of the model
        assert f"pipeinfer[{rank}]: slicing {tiny_model.name}: layers" in res.stderr
    assert (f"generated {N_PREDICT} tokens" in res.stderr) is summary, res.describe()
    if flags == ("-q",):
        assert res.stderr == "", res.describe()
    else:
        assert re.search(r"^pipeinfer\[0\]: ready: rank 0 pid \d+", res.stderr, re.M)
    verbose = flags == ("-v",)
    assert ("ms pipeinfer.head[0]: StartRun(" in res.stderr) is verbose, res.describe()
    assert "llama.cpp:" not in res.stderr  # -vv only


def test_verbose_and_quiet_exclude_each_other(tiny_model) -> None:
    res = subprocess.run([str(PIPEINFER), "run", "-m", str(tiny_model), "-p", PROMPT, "-v",
                          "-q"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2, res.stderr
    assert "Error: -v/--verbose and -q/--quiet exclude each other" in res.stderr


def test_split_quiet(tiny_model, tmp_path) -> None:
    def split(*flags: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(PIPEINFER), "split", "-m", str(tiny_model), "--layer-split",
                               "0.5,0.5", "-o", str(tmp_path), *flags], capture_output=True,
                              text=True, timeout=60)

    default, quiet, verbose = split(), split("-q"), split("-v")
    assert default.returncode == quiet.returncode == verbose.returncode == 0
    assert default.stdout == quiet.stdout == verbose.stdout  # the ranges and the manifest
    assert default.stderr.splitlines() == [
        f"writing {tmp_path / 'stage-00.gguf'} (rank 0: layers [0, 2))",
        f"writing {tmp_path / 'stage-01.gguf'} (rank 1: layers [2, 4) final)"]
    assert quiet.stderr == ""
    assert "stage-00.gguf: tensor 1/" in verbose.stderr


# --- the formats, in this process -------------------------------------------------------------

@pytest.fixture
def setup_logging(capsys):
    """cli.setup_logging, with the "pipeinfer" loggers as they were restored afterwards."""
    from pipeinfer.cli import commands as cli

    names = ("pipeinfer", "pipeinfer.model.llama_lib")
    saved = [(logging.getLogger(n), logging.getLogger(n).level, logging.getLogger(n).propagate,
              list(logging.getLogger(n).handlers)) for n in names]
    yield cli.setup_logging
    for logger, level, propagate, handlers in saved:
        logger.setLevel(level)
        logger.propagate = propagate
        logger.handlers[:] = handlers


def test_formats(setup_logging, capsys) -> None:
    log = logging.getLogger("pipeinfer.test")
    setup_logging(rank=0)
    log.debug("hidden")
    log.info("slicing")
    log.warning("stopped")
    log.error("it broke", extra={"fresh_line": True})
    assert capsys.readouterr().err == ("pipeinfer[0]: slicing\npipeinfer: stopped\n"
                                       "\npipeinfer: error: it broke\n")
    setup_logging(rank=1)  # by default progress shows of rank 0 only
    log.info("slicing")
    log.warning("notice")
    assert capsys.readouterr().err == "pipeinfer: notice\n"
    setup_logging(verbose=1, rank=1)
    log.debug("detail")
    logging.getLogger("pipeinfer.model.llama_lib").debug("llama.cpp: a line")  # -vv only
    assert re.fullmatch(r" *\d+\.\d ms pipeinfer\.test\[1\]: detail\n", capsys.readouterr().err)
    setup_logging(quiet=True)  # outside `run`: no rank
    log.info("progress")
    log.warning("notice")
    assert capsys.readouterr().err == "pipeinfer: notice\n"
    setup_logging()
    log.info("progress")
    assert capsys.readouterr().err == "progress\n"
