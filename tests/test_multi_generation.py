"""One job, generation after generation (engine/job.Head, what `pipeinfer serve` runs its
requests on): between generations every rank's KV cells and the draft model's are cleared and
run ids keep growing, so each generation's greedy tokens equal single-node llama.cpp's for its
own prompt, whatever came before it, a cancelled generation included. Under mpiexec with 3
ranks on the tiny model (a few seconds a launch); tests/support/jobs/multi_generation_job.py
is the job."""

from __future__ import annotations

import json

import pytest

from support import JOBS_DIR, mpi_util
from support.llama_oracle import llama_greedy

JOB = JOBS_DIR / "multi_generation_job.py"

# (prompt, tokens to generate, leave after this many: 0 = never)
PLAN = [["the number of people in the world", 12, 0],
        ["a small cat sat on the mat and the cat", 20, 4],   # cancelled early
        ["the world of people", 16, 0],
        ["the number of people in the world", 12, 0]]        # the first again


def run_plan(model, strategy: str, draft=None) -> dict:
    cmd = mpi_util.mpi_command(3, [mpi_util.PYTHON, JOB, model, strategy, draft or "-",
                                   json.dumps(PLAN)])
    launch = mpi_util.launch(cmd, timeout=120)
    assert launch.rc == 0 and launch.json is not None, launch.describe()
    return launch.json


@pytest.mark.parametrize("strategy,draft", [("iterative", None), ("speculative", None),
                                            ("pipeinfer", "aligned"), ("specpipe", None),
                                            ("pipespec", "aligned")])
def test_each_generation_is_exact(tiny_model, tiny_draft_aligned, strategy, draft):
    result = run_plan(tiny_model, strategy, tiny_draft_aligned if draft else None)
    gens = result["generations"]
    assert len(gens) == len(PLAN)
    for gen, (prompt, n, cancel_after) in zip(gens, PLAN):
        reference = llama_greedy(tiny_model, gen["prompt_tokens"], n, n_ctx=256,
                                 repack=result["repack"])
        if cancel_after:
            assert gen["stop"] == "cancelled" and gen["tokens"] == reference[:cancel_after]
        else:
            assert gen["tokens"] == reference, f"{strategy} departs on {prompt!r}"
        assert gen["partitions_free"]
    assert gens[0]["tokens"] == gens[3]["tokens"]
    if strategy != "iterative":
        assert sum(g["drafted"] for g in gens) > 0, "nothing speculated: the test proves little"
