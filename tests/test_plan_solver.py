"""The split solver (pipeinfer/plan/solver.py) on small cost tables whose optimum is computed by
hand in each case's comment; no llama.cpp, no MPI."""

from __future__ import annotations

import pytest

from pipeinfer.plan.cost import ModelShape, NodeCost, Pipeline, interpolate
from pipeinfer.plan.solver import NoSplit, solve


def node(ms: float, name: str = "n", output: float = 0.0, memory=None, rtt=0.0,
         draft=0.0) -> NodeCost:
    """A node whose layer costs `ms` whatever the step size (so b does not matter)."""
    return NodeCost(name, {1: ms, 8: ms}, {1: output, 8: output}, memory, rtt,
                    draft_ms=draft)


def pipe(nodes, n_layer, layer_mb=100.0, output_mb=0.0, draft_tokens=0) -> Pipeline:
    model = ModelShape("m", n_layer, layer_mb, output_mb, hidden_bytes=0, base_mb=0.0)
    return Pipeline(tuple(nodes), model, draft_tokens)


def test_interpolation_between_and_past_the_measured_sizes():
    table = {1: 10.0, 2: 14.0, 4: 16.0, 8: 24.0}
    assert interpolate(table, 3) == pytest.approx(15.0)
    assert interpolate(table, 16) == pytest.approx(40.0)   # the 4..8 slope, extended
    assert interpolate({1: 5.0}, 3) == pytest.approx(15.0)


def test_even_nodes_get_even_shares():
    # 12 layers x 10 ms over 4 equal nodes: 3 each, every stage 30 ms
    split = solve(pipe([node(10)] * 4, 12), "pipeinfer")
    assert split.counts == (3, 3, 3, 3) and split.bound_ms == pytest.approx(30)


def test_even_nodes_iterative_ties_go_to_the_most_even_split():
    # every split sums to 80 ms; the tie-break takes the lightest heaviest stage
    split = solve(pipe([node(10)] * 4, 8), "iterative")
    assert split.counts == (2, 2, 2, 2) and split.bound_ms == pytest.approx(80)


def test_the_output_layer_moves_layers_off_the_last_stage():
    # 11 layers x 10 ms, output 10 ms on the last stage: 4, 4, 3 + output = 40 ms each
    nodes = [node(10, output=10)] * 3
    split = solve(pipe(nodes, 11), "pipeinfer")
    assert split.counts == (4, 4, 3) and split.bound_ms == pytest.approx(40)


def test_one_slow_node_gets_a_smaller_share():
    # node 3 takes 30 ms a layer: 1 layer there (30 ms) and 3 on each fast node (30 ms);
    # without it the fast nodes would carry 10 layers: 40 ms
    split = solve(pipe([node(10)] * 3 + [node(30)], 10), "pipeinfer")
    assert split.counts == (3, 3, 3, 1) and split.bound_ms == pytest.approx(30)


def test_a_node_better_dropped():
    # node 3 takes 50 ms a layer: even one layer (50 ms) is slower than the fast nodes with 3
    # each (30 ms), so it gets none and rank 2 becomes the last stage
    split = solve(pipe([node(10)] * 3 + [node(50)], 9), "pipeinfer")
    assert split.counts == (3, 3, 3, 0) and split.bound_ms == pytest.approx(30)
    assert split.dropped == [3] and split.last == 2


def test_without_dropping_the_slow_node_keeps_one_layer():
    split = solve(pipe([node(10)] * 3 + [node(50)], 9), "pipeinfer", may_drop=False)
    assert split.counts[3] == 1 and split.bound_ms == pytest.approx(50)


def test_iterative_leaves_a_slower_node_out():
    # the sum: every layer on a 10 ms node costs 10, on the 30 ms node 30: 3 + 3 + 0 = 60 ms;
    # keeping the slow node in (one layer) costs 2 x 10 + 3 x 10 + 30 = 80 ms
    nodes = [node(10), node(10), node(30)]
    assert solve(pipe(nodes, 6), "iterative").counts == (3, 3, 0)
    kept = solve(pipe(nodes, 6), "iterative", may_drop=False)
    assert kept.counts[2] == 1 and kept.bound_ms == pytest.approx(80)


def test_hops_count_for_iterative():
    # equal nodes, 5 ms each way between them: fewer stages, fewer hops. Memory: 6 layers
    # of 100 MB at most per node, so the 8 layers need two nodes: 2 hops (40 + 40 + 10)
    nodes = [node(10, rtt=10, memory=600)] * 4
    split = solve(pipe(nodes, 8), "iterative")
    assert sum(1 for c in split.counts if c) == 2
    assert split.bound_ms == pytest.approx(80 + 2 * 5)


def test_a_small_memory_node_gets_what_fits():
    # node 2 holds 2 layers of 100 MB; the other 9 go 3, 3, 3 (30 ms); 1 layer there would
    # leave 10 for three nodes (40 ms)
    nodes = [node(10), node(10), node(10, memory=250), node(10)]
    split = solve(pipe(nodes, 11), "pipeinfer")
    assert split.counts == (3, 3, 2, 3) and split.bound_ms == pytest.approx(30)


def test_the_head_gets_layers_only_if_it_pays():
    # the head drafts 3 tokens per run: at 10 ms a token that is 30 ms, so one layer more
    # (40 ms) still beats the workers' 5 + 4 layers (50 ms): 1, 4, 4
    nodes = [node(10, draft=10), node(10), node(10)]
    assert solve(pipe(nodes, 9, draft_tokens=3), "pipeinfer").counts == (1, 4, 4)
    # at 20 ms a token the head is the bound already (60 ms): no layers for it
    nodes[0] = node(10, draft=20)
    split = solve(pipe(nodes, 9, draft_tokens=3), "pipeinfer")
    assert split.counts[0] == 0 and split.bound_ms == pytest.approx(60)


def test_a_drafting_head_needs_a_clear_margin_for_layers():
    # the head drafts 3 tokens at 9 ms (27 ms); 7 layers of 10 ms on two workers: 4 + 3 =
    # 40 ms. One layer on the head gives 1, 3, 3: 37 ms, 7.5 % better by the model, less
    # than the 10 % its loop's stall may cost: the head stays without layers (40 ms)
    nodes = [node(10, draft=9), node(10), node(10)]
    split = solve(pipe(nodes, 7, draft_tokens=3), "pipeinfer")
    assert split.counts[0] == 0 and split.bound_ms == pytest.approx(40)
    # 11 layers: 6 + 5 = 60 ms without; 1 on the head: 37, 5 + 5 = 50 ms (2: 47, 5 + 4 =
    # 50; 3: 57), 17 % better than 60: the head gets 1 or 2 layers
    split = solve(pipe(nodes, 11, draft_tokens=3), "pipeinfer")
    assert split.counts[0] in (1, 2) and split.bound_ms == pytest.approx(50)
    # a head that does not draft takes its share without a margin: 3, 2, 2 or so (30 ms)
    split = solve(pipe([node(10)] * 3, 7), "pipeinfer")
    assert split.counts[0] > 0 and split.bound_ms == pytest.approx(30)


def test_a_slow_drafting_head_does_not_skew_the_sum_tie_break():
    # speculative ("sum", 2 drafted tokens a run) at 100 ms a token: the head's item is 200
    # ms, but that is drafting, not a stage's load. Every split of 9 layers x 10 ms over the
    # three workers sums to 90 ms (+ 200); the tie-break takes the lightest heaviest stage:
    # 0, 3, 3, 3 (not 9 layers on one worker, which is still lighter than the head's 200)
    nodes = [node(10, draft=100), node(10), node(10), node(10)]
    split = solve(pipe(nodes, 9, draft_tokens=2), "speculative")
    assert split.counts == (0, 3, 3, 3) and split.bound_ms == pytest.approx(290)


def test_a_drafting_head_bound_keeps_the_stages_even():
    # the head drafts 3 x 100 ms a run: every split is bound by it. Stages: k1, k2, k3 + 4 ms
    # of output with k3 >= 1, so the heaviest is 5 at best (k3 = 1, k1 + k2 = 5): (0, 5, 1)
    # ties it, leaving node 1 out. The most even of the ties (least sum of squares) is 2, 3
    nodes = [node(1, draft=100)] + [node(1, output=4)] * 3
    split = solve(pipe(nodes, 6, draft_tokens=3), "pipeinfer", head_layers=False)
    assert split.counts == (0, 2, 3, 1) and split.bound_ms == pytest.approx(300)


def test_head_layers_forbidden():
    split = solve(pipe([node(10)] * 3, 8), "pipeinfer", head_layers=False)
    assert split.counts == (0, 4, 4)


def test_no_split_fits_the_memory():
    nodes = [node(10, name="a", memory=150), node(10, name="b", memory=250)]
    with pytest.raises(NoSplit, match="at most 3 of the 8 layers"):
        solve(pipe(nodes, 8), "pipeinfer")


def test_a_node_without_room_for_a_layer_is_named():
    nodes = [node(10), node(10, name="tiny", memory=50), node(10)]
    with pytest.raises(NoSplit, match=r"node 1 \(tiny\) has 50 MB free"):
        solve(pipe(nodes, 4), "pipeinfer", may_drop=False)


def test_fractions_reproduce_the_counts_through_partition():
    from pipeinfer.model.partition import parse_split, partition
    split = solve(pipe([node(10)] * 3 + [node(30)], 10), "pipeinfer")
    ranges = partition(10, parse_split(split.layer_split))
    assert tuple(r.n_layer for r in ranges) == split.counts


def test_a_launched_job_keeps_a_worker():
    # the head is as fast as anyone and every hop costs: all layers on it would be best,
    # but a job launched with workers keeps at least one stage after the head
    nodes = [node(10, rtt=20)] * 3
    assert solve(pipe(nodes, 4), "iterative").counts == (4, 0, 0)
    kept = solve(pipe(nodes, 4), "iterative", keep_worker=True)
    assert kept.last >= 1 and sum(1 for c in kept.counts[1:] if c) == 1
