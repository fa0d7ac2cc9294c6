"""The simulator (pipeinfer/plan/simulate.py): the real scheduler classes under a modelled
clock. Deterministic on fixed costs, and on an idealised pipeline (no links, flat step costs,
no polling sleeps) it reproduces the closed forms: iterative runs at 1 / (sum of stage times); a fully accepted
pipelined speculation is bounded by the slowest stage (a run of at most max_run tokens per
slowest-stage time) and beats iterative by about the number of stages."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipeinfer.plan.cost import PREFILL_STEP, ModelShape, NodeCost, Pipeline
from pipeinfer.plan.simulate import SimConfig, SimulationError, simulate
from pipeinfer.schedule.options import SpecOptions


def node(ms: float, draft: float = 0.0, rtt: float = 0.0, output: float = 0.0) -> NodeCost:
    """Flat costs: a step of any size, a prompt's batch too, costs what one token does."""
    return NodeCost("n", {1: ms, PREFILL_STEP: ms}, {1: output, 8: output}, None, rtt,
                    draft_ms=draft)


MODEL = ModelShape("m", 12, 10.0, 10.0, hidden_bytes=0, base_mb=0.0)


def pipe(*nodes) -> Pipeline:
    return Pipeline(tuple(nodes), MODEL)


def test_iterative_is_one_over_the_sum_of_stage_times():
    # stages of 4 x 10, 4 x 20 and 4 x 5 ms + 30 ms output: 170 ms a token
    p = pipe(node(1), node(10), node(20), node(5, output=30))
    result = simulate(p, [0, 4, 4, 4], SimConfig("iterative", n_predict=32, prompt_len=16,
                                                 idle_sleep=False))
    assert result.speed_tps == pytest.approx(1000 / 170)
    assert result.itl_s == pytest.approx(0.170) and result.second_token_s == pytest.approx(0.170)
    assert result.ttft_s == pytest.approx(0.170)   # the prompt: one batch, as dear as a token


def test_a_short_prompts_tail_runs_pass_the_stages_one_behind_the_other():
    # 32 tokens as two runs of 16 (--prefill-tail): the second leaves the last stage one
    # slowest stage (80 ms) after the first; as one batch, a single pass of 170 ms
    p = pipe(node(1), node(10), node(20), node(5, output=30))
    runs = simulate(p, [0, 4, 4, 4], SimConfig("iterative", n_predict=8, prompt_len=32,
                                               idle_sleep=False))
    one = simulate(p, [0, 4, 4, 4], SimConfig("iterative", n_predict=8, prompt_len=32,
                                              prefill_tail=0, idle_sleep=False))
    assert runs.ttft_s == pytest.approx(0.170 + 0.080) and one.ttft_s == pytest.approx(0.170)


def test_iterative_counts_the_hops():
    # 2 ms round trips: each of the 3 hops (head -> 1 -> 2 -> head) adds 1 ms
    p = pipe(node(1, rtt=2), node(10, rtt=2), node(10, rtt=2))
    result = simulate(p, [0, 6, 6], SimConfig("iterative", n_predict=16, idle_sleep=False))
    assert result.speed_tps == pytest.approx(1000 / 123)


def test_idle_ranks_see_messages_half_a_polling_sleep_late():
    # run's idle waits sleep 1 % of the time idle, between 0.25 and 5 ms; a message waits
    # half a sleep. One stage of 1200 ms: the head, idle 1.2 s per token, sleeps 5 ms (sees
    # the result 2.5 ms late); the worker, idle only those 2.5 ms, sleeps 0.25 ms (0.125)
    p = pipe(node(1), node(100))
    result = simulate(p, [0, 12], SimConfig("iterative", n_predict=16))
    assert result.itl_s == pytest.approx(1.2 + 0.0025 + 0.000125)


# The pipeline's bounds with the guard off: its one measurement of plain decoding (a few
# one-token runs at the 120 ms round trip) is not what they check (the next test does).
NO_GUARD = SpecOptions(guard=False)


def test_fully_accepted_speculation_is_bounded_by_the_slowest_stage():
    # 3 stages of 40 ms (flat: any run size costs the same), instant drafts, every guess
    # right: at most one run of max_run = 3 tokens per 40 ms leaves the slowest stage
    p = pipe(node(10, draft=1e-6), node(10), node(10), node(10))
    result = simulate(p, [0, 4, 4, 4], SimConfig("pipeinfer", n_predict=128, accept_rate=1.0,
                                                 spec=NO_GUARD))
    bound = 3 / 0.040
    iterative = 1 / 0.120
    assert result.speed_tps <= bound * 1.001
    assert result.speed_tps >= 0.8 * bound        # the pipeline stays full
    assert result.speed_tps > 2.5 * iterative
    # (guesses of runs still in flight when the 128th token came are never verified)
    assert result.accept_rate > 0.85 and result.counters["runs_cancelled"] == 0


def test_the_guard_measures_plain_decoding_once():
    """With the guard, speculation that pays pauses once, for the clean one-token runs that
    measure plain decoding (after the runs in flight have delivered their tokens), and goes
    on: a few tokens at plain decoding's pace, never a pause after."""
    p = pipe(node(10, draft=1e-6), node(10), node(10), node(10))
    cfg = SimConfig("pipeinfer", n_predict=128, accept_rate=1.0)
    on = simulate(p, [0, 4, 4, 4], cfg)
    off = simulate(p, [0, 4, 4, 4], replace(cfg, spec=NO_GUARD))
    # three clean runs, the one sent as the last runs in flight drained, the pipeline
    # filling again: about five round trips of 120 ms
    assert 128 / off.speed_tps < 128 / on.speed_tps <= 128 / off.speed_tps + 5 * 0.120


def test_a_slower_stage_sets_the_bound():
    p = pipe(node(10, draft=1e-6), node(10), node(20), node(10))
    result = simulate(p, [0, 4, 4, 4], SimConfig("pipeinfer", n_predict=128, accept_rate=1.0,
                                                 spec=NO_GUARD))
    assert 0.8 * 3 / 0.080 <= result.speed_tps <= 3 / 0.080 * 1.001


def test_the_draft_supply_bounds_pipelined_speculation():
    # drafting 30 ms a token: the pipeline (3 tokens per 40 ms) waits for the draft model
    p = pipe(node(10, draft=30), node(10), node(10), node(10))
    result = simulate(p, [0, 4, 4, 4], SimConfig("pipeinfer", n_predict=64, accept_rate=1.0))
    assert result.speed_tps <= 1 / 0.030 * 1.05


def test_deterministic_on_fixed_costs():
    p = pipe(node(10, draft=7), node(12, rtt=0.5), node(9, rtt=0.5), node(11, rtt=0.5))
    cfg = SimConfig("pipeinfer", n_predict=64, accept_rate=0.7, seed=3)
    first, second = simulate(p, [0, 4, 4, 4], cfg), simulate(p, [0, 4, 4, 4], cfg)
    assert first.to_dict() == second.to_dict()
    assert first.counters["runs_cancelled"] > 0  # wrong guesses were cancelled in flight


@pytest.mark.parametrize("strategy", ["iterative", "speculative", "pipeinfer"])
def test_every_strategy_generates_what_was_asked(strategy):
    p = pipe(node(10, draft=5), node(10), node(10))
    result = simulate(p, [0, 6, 6], SimConfig(strategy, n_predict=40, accept_rate=0.8))
    assert result.n_generated == 40 and result.speed_tps > 0


def test_head_layers_share_the_head_with_the_draft():
    p = pipe(node(10, draft=5), node(10), node(10))
    result = simulate(p, [2, 5, 5], SimConfig("pipeinfer", n_predict=40, accept_rate=0.9))
    assert result.busy_s[0] > 0 and result.n_generated == 40


def test_the_head_loop_slows_a_threaded_draft_on_a_fraction_of_a_core():
    # a quarter-core head drafting 30 ms a token alone: beside pipeinfer's loop (0.035 core)
    # its draft thread gets 0.215 core, so the draft-bound pipeline slows by 0.215 / 0.25;
    # speculative drafts inline (no loop meanwhile); a head with 2 cores has room for both
    def speed(strategy, cores):
        head = NodeCost("h", {1: 10, PREFILL_STEP: 10}, {1: 0, 8: 0}, None, 0.0, draft_ms=30,
                        cores=cores)
        p = pipe(head, node(10), node(10), node(10))
        cfg = SimConfig(strategy, n_predict=64, accept_rate=1.0, idle_sleep=False,
                        spec=NO_GUARD)
        return simulate(p, [0, 4, 4, 4], cfg).speed_tps

    assert speed("pipeinfer", 0.25) == pytest.approx(speed("pipeinfer", None) * 0.215 / 0.25,
                                                     rel=0.02)
    assert speed("pipeinfer", 2.0) == speed("pipeinfer", None)
    assert speed("speculative", 0.25) == speed("speculative", None)


def test_draft_step_time_with_the_head_loop():
    # the loop takes 0.05 core of 0.5, 0.075 of 1 (cost.HEAD_LOOP_CORES), 0.0625 of 0.75
    head = NodeCost("h", {1: 1}, {1: 0}, draft_ms=20, cores=0.5)
    assert head.draft_step_ms(threaded=True) == pytest.approx(20 * 0.5 / 0.45)
    assert head.draft_step_ms(threaded=False) == 20
    three = NodeCost("h", {1: 1}, {1: 0}, draft_ms=20, cores=0.75)
    assert three.draft_step_ms(threaded=True) == pytest.approx(20 * 0.75 / 0.6875)
    one = NodeCost("h", {1: 1}, {1: 0}, draft_ms=20, cores=1.0)
    assert one.draft_step_ms(threaded=True) == pytest.approx(20 / 0.925)
    assert NodeCost("h", {1: 1}, {1: 0}, draft_ms=20, cores=1.5).draft_step_ms(True) == 20
    assert NodeCost("h", {1: 1}, {1: 0}, draft_ms=20).draft_step_ms(True) == 20


@pytest.mark.parametrize("counts, cfg, message", [
    ([0, 6, 5], SimConfig("iterative"), "places 11 layers"),
    ([0, 12], SimConfig("iterative"), "2 shares for 3 nodes"),
    ([0, 6, 6], SimConfig("pipespec"), "simulate supports"),
    ([0, 6, 6], SimConfig("iterative", n_predict=1), "at least 2"),
    ([0, 6, 6], SimConfig("pipeinfer", accept_rate=1.5), "not between 0 and 1"),
])
def test_impossible_settings_are_refused(counts, cfg, message):
    with pytest.raises(SimulationError, match=message):
        simulate(pipe(node(10, draft=5), node(10), node(10)), counts, cfg)


def test_no_draft_time_is_refused_for_speculation():
    with pytest.raises(SimulationError, match="draft model's time"):
        simulate(pipe(node(10), node(10), node(10)), [0, 6, 6], SimConfig("pipeinfer"))


def test_messages_never_overtake_on_a_slow_link():
    # a skipped run's empty message is smaller than the run before it: on a link of 1 MB/s
    # it would arrive first if messages could overtake (the core then sees results out of
    # order and refuses them)
    slow = NodeCost("n", {1: 10.0, PREFILL_STEP: 10.0}, {1: 0.0, 8: 0.0}, None, 2.0, 1.0)
    model = ModelShape("m", 12, 10.0, 10.0, hidden_bytes=6144, base_mb=0.0)
    p = Pipeline((node(10, draft=3, rtt=2), slow, slow, slow), model)
    for seed in range(4):
        cfg = SimConfig("pipeinfer", n_predict=48, accept_rate=0.6, seed=seed)
        assert simulate(p, [0, 4, 4, 4], cfg).n_generated == 48
