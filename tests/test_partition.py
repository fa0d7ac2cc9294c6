"""Layer splits: the rounding rule of partition.py and every refusal, with its message."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeinfer.model.partition import (PartitionError, StageRange, format_split,
                                 parse_layer_split, parse_split, partition)


def bounds(ranges: list[StageRange]) -> list[tuple[int, int]]:
    return [(r.first, r.last) for r in ranges]


# --- the rounding rule ---------------------------------------------------------------------

@pytest.mark.parametrize("n_layer, fractions, expected", [
    (30, [1.0], [(0, 30)]),
    (30, [0.5, 0.5], [(0, 15), (15, 30)]),
    (30, [0.1, 0.3, 0.3, 0.3], [(0, 3), (3, 12), (12, 21), (21, 30)]),
    # cumulative 7.5 and 22.5 round half up to 8 and 23 (each share rounded alone: 8,8,8,8 = 32)
    (30, [0.25, 0.25, 0.25, 0.25], [(0, 8), (8, 15), (15, 23), (23, 30)]),
    (5, [0.5, 0.5], [(0, 3), (3, 5)]),              # 2.5 -> 3
    (2, [0.25, 0.75], [(0, 1), (1, 2)]),            # 0.5 -> 1
    (3, [1 / 3, 1 / 3, 1 / 3], [(0, 1), (1, 2), (2, 3)]),
    (28, [0.1, 0.3, 0.3, 0.3], [(0, 3), (3, 11), (11, 20), (20, 28)]),  # 2.8, 11.2, 19.6
    # decimal halves that float arithmetic puts just below .5 still round up
    (10, [0.55, 0.34, 0.11], [(0, 6), (6, 9), (9, 10)]),
    (10, [0.08, 0.47, 0.45], [(0, 1), (1, 6), (6, 10)]),
    (15, [0.34, 0.56, 0.1], [(0, 5), (5, 14), (14, 15)]),
    (4, [0, 0.5, 0.5], [(0, 0), (0, 2), (2, 4)]),   # head holds no layers
    (4, [0, 0.25, 0.25, 0.25, 0.25], [(0, 0), (0, 1), (1, 2), (2, 3), (3, 4)]),
])
def test_rounding_rule(n_layer, fractions, expected):
    ranges = partition(n_layer, fractions)
    assert bounds(ranges) == expected
    assert [r.rank for r in ranges] == list(range(len(fractions)))
    assert [r.final for r in ranges] == [False] * (len(fractions) - 1) + [True]
    assert sum(r.n_layer for r in ranges) == n_layer


@settings(max_examples=300, deadline=None)
@given(n_layer=st.integers(1, 200),
       weights=st.lists(st.integers(1, 1000), min_size=1, max_size=8),
       head_zero=st.booleans())
def test_rounding_rule_property(n_layer, weights, head_zero):
    """Boundaries are the rounded cumulative sums: contiguous, covering, every boundary within
    half a layer of the exact one; refusals only for the documented reasons."""
    if head_zero:
        weights = [0] + weights
    total = sum(weights)
    fractions = [w / total for w in weights]
    try:
        ranges = partition(n_layer, fractions)
    except PartitionError as err:
        assert "no layers" in str(err) or "only" in str(err)
        return
    assert ranges[0].first == 0 and ranges[-1].last == n_layer
    cumulative = 0.0
    for r, nxt in zip(ranges, ranges[1:]):
        assert r.last == nxt.first
    for r, f in zip(ranges, fractions):
        cumulative += f
        assert abs(r.last - n_layer * cumulative) <= 0.5 + 1e-9
        x = n_layer * cumulative
        if abs(x - math.floor(x) - 0.5) < 1e-9:
            # a half (up to float error in this test's own sum): rounded up if exact
            assert r.last in (math.floor(x), math.ceil(x))
        else:
            assert r.last == math.floor(x + 0.5)
    # exact halves round up: the weights are integers, so check with integer arithmetic
    acc = 0
    for r, w in zip(ranges, weights):
        acc += w
        assert r.last == (2 * n_layer * acc + total) // (2 * total)
    assert all(r.n_layer >= 1 for r in ranges[1:])


def test_head_fraction_zero_allowed():
    ranges = partition(30, [0.0, 0.5, 0.5])
    assert ranges[0].n_layer == 0 and not ranges[0].final
    assert bounds(ranges[1:]) == [(0, 15), (15, 30)]


def test_sum_tolerance_is_1e6():
    partition(10, [0.5, 0.5 + 5e-7])      # within 1e-6: accepted
    partition(10, [0.5, 0.5 - 5e-7])
    with pytest.raises(PartitionError, match=r"sum to 1\.000002, not 1"):
        partition(10, [0.5, 0.5 + 2e-6])


def test_format_split():
    assert bounds(partition(30, [1 / 3] * 3)) == [(0, 10), (10, 20), (20, 30)]
    assert format_split([0.1, 0.3, 0.6]) == "0.1,0.3,0.6"
    assert parse_split(format_split([0.1, 0.3, 0.6])) == [0.1, 0.3, 0.6]


def test_str():
    assert str(StageRange(2, 10, 20, True)) == "rank 2: layers [10, 20) final"
    assert str(StageRange(0, 0, 10, False)) == "rank 0: layers [0, 10)"


# --- refusals ------------------------------------------------------------------------------

def test_refuse_negative_fraction():
    with pytest.raises(PartitionError, match="non-negative"):
        partition(10, [-0.5, 1.5])
    with pytest.raises(PartitionError, match="fractions must be finite and non-negative"):
        parse_split("-0.5,1.5")


@pytest.mark.parametrize("text", ["nan,1", "inf,0", "0.5,-inf"])
def test_refuse_non_finite(text):
    with pytest.raises(PartitionError, match="finite and non-negative"):
        parse_split(text)


@pytest.mark.parametrize("text", ["", "a,b", "0.5;0.5", "0.5,,0.5"])
def test_refuse_malformed(text):
    with pytest.raises(PartitionError, match="not a comma-separated list of numbers"):
        parse_split(text)


@pytest.mark.parametrize("fractions, total", [([0.5, 0.4], "0.9"), ([0.6, 0.6], "1.2"),
                                               ([0.0, 0.0], "0")])
def test_refuse_sum_not_one(fractions, total):
    with pytest.raises(PartitionError, match=rf"sum to {total}, not 1"):
        partition(10, fractions)


def test_refuse_empty():
    with pytest.raises(PartitionError, match="layer split is empty"):
        partition(10, [])


def test_refuse_worker_without_layers():
    # cumulative 5.0 and 5.1: rank 1 gets round(5.1) - round(5.0) = 0 layers
    with pytest.raises(PartitionError,
                       match=r"gives rank 1 no layers of 10; only rank 0 \(the head\) may hold none"):
        partition(10, [0.5, 0.01, 0.49])
    with pytest.raises(PartitionError, match="gives rank 2 no layers"):
        partition(10, [0.0, 1.0, 0.0])


def test_refuse_more_ranks_than_layers():
    msg = "5 ranks but the model has only 4 layers: every rank after the head needs at least one"
    with pytest.raises(PartitionError, match=msg):
        partition(4, [0.2] * 5)
    with pytest.raises(PartitionError, match="6 ranks but the model has only 4 layers"):
        partition(4, [0.0] + [0.2] * 5)
    partition(4, [0.0] + [0.25] * 4)  # head with none plus one layer per worker: fine


@pytest.mark.parametrize("text,fractions,drafts", [
    ("0,0.5,0.5", [0, 0.5, 0.5], 0), ("0,1/1", [0, 1], 1), ("1/1/1", [1], 2),
    ("0.25,0.75/1.0", [0.25, 0.75], 1)])
def test_parse_layer_split_with_draft_ranks(text, fractions, drafts):
    assert parse_layer_split(text) == (fractions, drafts)


@pytest.mark.parametrize("text", ["0,1/0.5", "0,1/", "0,1/x", "0,1/1,0"])
def test_parse_layer_split_refuses_split_drafts(text):
    with pytest.raises(PartitionError, match="1 per draft model"):
        parse_layer_split(text)


def test_split_command_refuses_draft_ranks():
    with pytest.raises(PartitionError, match="draft models on ranks of their own"):
        parse_split("0,1/1")
