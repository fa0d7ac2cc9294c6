"""Runs only as deep as their rows pay (model/row_costs.py): every worker times its stage on
runs of a few rows at start-up, the head keeps the slowest stage's figures, and the drafter
stops a branch before a token whose chance of being reached is under what its row costs."""

from __future__ import annotations

import pytest

from pipeinfer.engine.drafting.drafter import Drafter, DraftParams
from pipeinfer.model.row_costs import marginal, row_cost, time_rows
from pipeinfer.model.stage import Stage, StageConfig
from support import mpi_util
from support.tiny_set import N_BATCH, PROMPT


def test_marginal_is_the_slowest_stage_s_extra_rows_against_one():
    fast, slow = (0.010, 0.012, 0.014), (0.020, 0.033, 0.045)
    assert marginal([fast, (), slow]) == pytest.approx((0.65, 0.6))
    assert marginal([(0.02, 0.019, 0.03)]) == pytest.approx((0.0, 0.55))  # (noise: not < 0)
    assert marginal([(), ()]) == ()


def test_rows_beyond_those_timed_cost_what_the_last_did():
    assert [row_cost((0.65, 0.6), row) for row in (1, 2, 3, 4, 9)] == [0, 0.65, 0.6, 0.6, 0.6]
    assert row_cost((), 3) == 0


@pytest.mark.parametrize("final", [False, True])
def test_a_stage_is_timed_and_left_empty(tiny, final):
    last = tiny.n_layer if final else 2
    config = StageConfig(n_ctx=256, n_batch=N_BATCH, n_seq_max=2)
    with Stage(tiny.stage_file(1, last, final), config, final=final, label="w") as stage:
        seconds = time_rows(stage, sizes=(1, 2, 3))
        assert len(seconds) == 3 and all(s > 0 for s in seconds)
        assert stage.seq_pos_max(0) == -1     # nothing left in its cells


@pytest.fixture
def drafter(tiny):
    stage = Stage(tiny.aligned, StageConfig(n_ctx=512, n_batch=N_BATCH, n_seq_max=1),
                  final=True, label="draft")
    try:
        yield Drafter(stage, N_BATCH)
    finally:
        stage.close()


def test_a_branch_stops_before_a_row_its_chance_does_not_pay(drafter, tiny):
    context = list(tiny.prompt)
    free, probs = drafter.draft(context, DraftParams(3), cutoff=0.0)
    assert len(free[0]) == 3
    reach = [probs[0], probs[0] * probs[1], probs[0] * probs[1] * probs[2]]

    def drafted(costs) -> list[int]:
        branches, _ = drafter.draft(context, DraftParams(3, row_costs=costs), cutoff=0.0)
        return branches[0]

    assert drafted((0.0, 0.0)) == free[0]
    # row 2 pays (its reach is the cost, just), row 3 does not (its reach is just under)
    assert drafted((reach[1], reach[2] + 1e-6)) == free[0][:2]
    # rows from the second on cost more than the second token's chance
    assert drafted((reach[1] + 1e-6,)) == free[0][:1]


def _run(tiny, *args) -> dict:
    launch = mpi_util.run_pipeinfer(3, tiny.target, PROMPT, "--ignore-eos", "--strategy",
                                    "pipeinfer", "-md", tiny.aligned, "--layer-split",
                                    "0,0.5,0.5", *args, n_predict=40, timeout=120)
    assert launch.rc == 0 and not launch.timed_out and launch.json, launch.describe()
    return launch.json


@pytest.mark.slow
def test_workers_time_their_stages_and_the_output_stays_exact(tiny):
    timed = _run(tiny)
    assert len(timed["row_costs"]) == 3 and all(c >= 0 for c in timed["row_costs"])
    assert timed["tokens"] == list(tiny.reference[:40])
    untimed = _run(tiny, "--no-row-costs")
    assert untimed["row_costs"] == []
    assert untimed["tokens"] == timed["tokens"]
