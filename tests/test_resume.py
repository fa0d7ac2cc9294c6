"""A generation resumed part-way on a job of its own (what a service does after a node failed,
issue 32) gives the tokens an undisturbed one gives: the prompt and the tokens already sent are
evaluated again in the batches they had (the prompt in -b chunks, the generated tokens in runs
of the exact run size), and a sampled token depends on (seed, position) alone. Real mpiexec,
real llama.cpp, every strategy that serves."""

from __future__ import annotations

import json

import pytest

from support import JOBS_DIR
from support.mpi_util import MPIEXEC, PYTHON, launch, mpi_env

CUTS = [1, 2, 5, 9, 16]
N = 24


def resumed_runs(model, strategy: str, draft, plan, n_ranks: int = 3, timeout: float = 240):
    cmd = [str(MPIEXEC), "-n", str(n_ranks), str(PYTHON), str(JOBS_DIR / "resume_job.py"),
           str(model), strategy, str(draft) if draft else "-", json.dumps(plan)]
    result = launch(cmd, timeout=timeout, env=mpi_env())
    assert result.rc == 0 and not result.timed_out, result.describe()
    return json.loads(result.stdout.strip().splitlines()[-1])


def assert_resumes(answers) -> None:
    for answer in answers:
        whole = answer["whole"]
        assert len(whole) == N
        for k, tokens in answer["resumed"].items():
            assert tokens == whole, f"resumed after {k} tokens: {tokens} != {whole}"


@pytest.mark.parametrize("strategy", ["iterative", "speculative", "pipeinfer"])
def test_greedy_and_seeded_resume_exactly(tiny_model, tiny_draft_aligned, strategy):
    draft = None if strategy == "iterative" else tiny_draft_aligned
    plan = [["def main():\n    return", N, 0.0, 0, CUTS],
            ["import os\n", N, 0.9, 1234, CUTS]]
    assert_resumes(resumed_runs(tiny_model, strategy, draft, plan))


@pytest.mark.slow
@pytest.mark.smollm2
def test_smollm2_pipeinfer_resumes_exactly(smollm2):
    plan = [["The three most important inventions are", N, 0.0, 0, CUTS],
            ["Once upon a time", N, 0.8, 7, CUTS]]
    assert_resumes(resumed_runs(smollm2, "pipeinfer", smollm2, plan))
