"""The default layer split (pipeinfer/model/balance.py): stages of equal weight with the output
head counted, rank 0 without layers when it runs a draft model; and what `plan` gives a run
without --layer-split."""

from __future__ import annotations

import itertools

import pytest

from pipeinfer.config.job import JobConfig
from pipeinfer.job.setup import plan
from pipeinfer.model.balance import balanced_counts, balanced_split, layer_bytes
from pipeinfer.model.models import ModelError, resolve_model
from pipeinfer.model.partition import PartitionError, partition
from pipeinfer.model.slicing import model_info, read_model


def heaviest(per_layer, final, counts) -> int:
    bounds = list(itertools.accumulate([0] + counts))
    loads = [sum(per_layer[a:b]) for a, b in zip(bounds, bounds[1:])]
    loads[-1] += final
    return max(loads)


@pytest.mark.parametrize("per_layer, final, stages, expected", [
    ([10] * 28, 50, 3, [11, 11, 6]),      # the output head weighs 5 layers: the last gets fewer
    ([10] * 28, 0, 4, [7, 7, 7, 7]),      # no head: even
    ([10] * 6, 1000, 3, [2, 3, 1]),       # a huge head: the last stage keeps one layer
    ([10] * 4, 0, 4, [1, 1, 1, 1]),
])
def test_balanced_counts(per_layer, final, stages, expected):
    assert balanced_counts(per_layer, final, stages) == expected


def test_no_contiguous_split_is_lighter():
    per_layer, final = [3, 9, 4, 4, 7, 1, 8, 2], 11
    counts = balanced_counts(per_layer, final, 3)
    every = [[a, b, 8 - a - b] for a in range(1, 7) for b in range(1, 8 - a)]
    assert heaviest(per_layer, final, counts) == min(heaviest(per_layer, final, c)
                                                     for c in every)


def test_more_stages_than_layers_is_refused():
    with pytest.raises(ValueError, match="cannot split 4 layers over 5 stages"):
        balanced_counts([1] * 4, 0, 5)


def test_split_reproduces_the_counts_through_partition(tiny_model):
    header = read_model(tiny_model)
    info = model_info(header, tiny_model)
    fractions = balanced_split(header, info.n_layer, 3, head_layers=False)
    assert fractions[0] == 0.0
    ranges = partition(info.n_layer, fractions)
    per_layer, final = layer_bytes(header, info.n_layer)
    counts = balanced_counts(per_layer, final, 2)
    assert [r.n_layer for r in ranges[1:]] == counts


def qwen() -> str:
    try:
        return str(resolve_model("qwen-coder-1.5b", fetch_missing=False))
    except (ModelError, TypeError):
        pytest.skip("Qwen2.5-Coder 1.5B is not cached")


@pytest.mark.parametrize("strategy, draft, size, layers", [
    # the head drafts: no target layers; the last stage carries the output matrix (Q6_K,
    # 182 MiB, about 7 of the 25-28 MiB layers)
    ("pipeinfer", "qwen-coder-0.5b", 4, [0, 11, 12, 5]),
    ("pipeinfer", "qwen-coder-0.5b", 8, [0, 4, 4, 4, 5, 5, 5, 1]),
    # no draft model on the head: it takes its share
    ("iterative", None, 4, [8, 9, 9, 2]),
])
def test_default_split_of_qwen(strategy, draft, size, layers):
    cfg = JobConfig(model=qwen(), strategy=strategy, drafts=(draft,) if draft else ())
    ranges, _ = plan(cfg, size)
    assert [r.n_layer for r in ranges] == layers


def test_explicit_split_is_kept(tiny_model):
    cfg = JobConfig(model=str(tiny_model), strategy="iterative",
                    split=(0.5, 0.25, 0.25))
    assert [r.n_layer for r in plan(cfg, 3)[0]] == [2, 1, 1]


def test_too_many_ranks_for_the_default_split(tiny_model):
    cfg = JobConfig(model=str(tiny_model), strategy="iterative")
    with pytest.raises(PartitionError, match="5 ranks but the model has only 4 layers"):
        plan(cfg, 5)
