"""A relaunched job's rank loads the stage it held last time while the head plans
(job/preload.py): taken when the plan gives it the same file, layers and settings, closed
otherwise, never tried in a job of another size. Real llama.cpp stages of a real GGUF."""

from __future__ import annotations

import pytest

from pipeinfer.job.preload import Preload
from pipeinfer.model.partition import StageRange
from pipeinfer.model.stage import Stage, StageConfig

CONFIG = StageConfig(n_ctx=256, n_batch=64)
RANGE = StageRange(rank=1, first=0, last=4, final=True)


@pytest.fixture
def front_env(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPEINFER_CACHE", str(tmp_path))
    monkeypatch.setenv("PIPEINFER_FRONT_KEY", "ef" * 32)


def _load(path, rng):
    return Stage(path, CONFIG, final=rng.final)


def test_the_stage_of_the_last_job_is_taken_when_the_plan_gives_it_again(tiny_model,
                                                                        front_env):
    first = Preload(1, 3, _load)
    assert first.take(tiny_model, RANGE, CONFIG) is None   # (nothing noted yet)
    first.note(tiny_model, RANGE)
    again = Preload(1, 3, _load)
    stage = again.take(tiny_model, RANGE, CONFIG)
    assert isinstance(stage, Stage) and again.used
    stage.close()


@pytest.mark.parametrize("other", ["layers", "settings"])
def test_another_plan_closes_the_early_stage(tiny_model, front_env, other):
    Preload(1, 3, _load).note(tiny_model, RANGE)
    again = Preload(1, 3, _load)
    rng = StageRange(1, 0, 3, True) if other == "layers" else RANGE
    config = StageConfig(n_ctx=512, n_batch=64) if other == "settings" else CONFIG
    assert again.take(tiny_model, rng, config) is None and not again.used


def test_a_job_of_another_size_or_without_a_front_loads_nothing_early(tiny_model, front_env,
                                                                     monkeypatch):
    Preload(1, 3, _load).note(tiny_model, RANGE)
    assert Preload(1, 4, _load).loading is None          # (a host was lost: other layers)
    monkeypatch.delenv("PIPEINFER_FRONT_KEY")
    assert Preload(1, 3, _load).loading is None
