"""`simulate` and `plan` model the prompt: it goes through the pipeline in chunks (all sent at
once, so the stages work on different chunks at the same time), a chunk's layers cost what a
batch of its size was measured to cost, and the output layer computes only the last chunk's
last row. TTFT is the time to the first token of a --prompt-len prompt. Calibration times the
layer at the prompt chunk's size; a profile without that step is refused with the fix."""

from __future__ import annotations

import json

import pytest

from support.mpi_util import PIPEINFER, launch
from pipeinfer.model.stage_cache import content_digest
from pipeinfer.plan import measure, modelled
from pipeinfer.plan.cost import (PREFILL_STEP, STEP_SIZES, ModelShape, NodeCost, Pipeline,
                                 costs_step)
from pipeinfer.plan.profile import ModelId, NodeFigures, Profile
from pipeinfer.plan.simulate import SimConfig, SimulationError, simulate

MODEL = ModelShape("m", 12, 10.0, 10.0, hidden_bytes=0, base_mb=0.0)
CHUNK_MS = 25.0     # one layer's time for a 128-token chunk in these pipelines
STAGE_MS = 4 * CHUNK_MS


def node(output_ms: float = 0.0) -> NodeCost:
    """A node whose layer takes 1 ms a token, 2 ms for 8, CHUNK_MS for a prompt chunk (and
    proportionally more for larger batches), its output layer `output_ms` a row."""
    return NodeCost("n", {1: 1.0, 8: 2.0, PREFILL_STEP: CHUNK_MS},
                    {1: output_ms, 8: 8 * output_ms}, draft_ms=1.0)


def pipe(output_ms: float = 0.0, workers: int = 3) -> Pipeline:
    return Pipeline((node(),) + tuple(node(output_ms) for _ in range(workers)), MODEL)


def ttft(p: Pipeline, prompt_len: int, strategy: str = "iterative", **cfg) -> float:
    counts = [0] + [MODEL.n_layer // (len(p.nodes) - 1)] * (len(p.nodes) - 1)
    result = simulate(p, counts, SimConfig(strategy, n_predict=8, prompt_len=prompt_len,
                                           idle_sleep=False, **cfg))
    assert result.prefill_tps == pytest.approx(prompt_len / result.ttft_s)
    return result.ttft_s


@pytest.mark.parametrize("strategy", ["iterative", "pipeinfer"])
def test_a_longer_prompt_takes_longer_to_the_first_token(strategy):
    times = [ttft(pipe(), n, strategy) for n in (16, 128, 512, 2048)]
    assert times == sorted(times) and len(set(times)) == len(times)


@pytest.mark.parametrize("n_chunks", [1, 2, 4, 8])
def test_n_chunks_on_s_equal_stages_take_n_plus_s_minus_1_chunk_steps(n_chunks):
    # 3 worker stages of 4 layers: a chunk takes STAGE_MS on each; chunk i leaves the last
    # stage at (i + 3) x STAGE_MS
    assert ttft(pipe(), n_chunks * PREFILL_STEP) == pytest.approx(
        (n_chunks + 3 - 1) * STAGE_MS / 1e3)


def test_chunks_in_flight_beat_the_whole_prompt_in_one_batch():
    # the same 1024 tokens as one batch (a chunk as large as the prompt) pass each stage in
    # turn, about 3 x 8 chunk-steps, against 8 + 2 when the stages work on different chunks
    p = pipe()
    one_batch = ttft(p, 1024, prefill_chunk=1024, n_batch=1024)
    assert one_batch == pytest.approx(3 * p.stage_ms(1, 4, False, 1024) / 1e3)
    assert one_batch > 0.9 * 3 * 8 * STAGE_MS / 1e3
    assert ttft(p, 1024) < 0.5 * one_batch


def test_the_output_layer_computes_one_row_per_prompt():
    # 40 ms a row of logits: the prompt's 512 rows would cost 20 s; its last row costs 40 ms
    with_output = ttft(pipe(output_ms=40.0), 4 * PREFILL_STEP)
    without = ttft(pipe(), 4 * PREFILL_STEP)
    assert with_output - without == pytest.approx(0.040)


def test_a_node_without_the_prompt_chunk_step_is_refused():
    small = NodeCost("host:1", {1: 1.0, 8: 2.0}, {1: 0.5, 8: 1.0})
    p = Pipeline((node(), small, small), MODEL)
    with pytest.raises(SimulationError, match=r"up to 8 tokens, not for the prompt's batches "
                                              r"of 64: measure the profile again"):
        simulate(p, [0, 6, 6], SimConfig("iterative", n_predict=8, prompt_len=100))
    assert simulate(p, [0, 6, 6], SimConfig("iterative", n_predict=8, prompt_len=8)).ttft_s > 0
    assert costs_step({1: 1.0, PREFILL_STEP: 9.0}, 4 * PREFILL_STEP)  # past the chunk: fair


def test_calibration_times_a_prompt_chunk_of_layers(smollm2):
    # SmolLM2's layers for a 128-token batch: dearer than an 8-token step, and per token no
    # dearer (a batch never costs more per token than the small steps; noise allowed)
    layers, output = measure.measure_layers(measure.local_slices(smollm2, 30), 1,
                                            prefill=PREFILL_STEP)
    assert sorted(layers) == [*STEP_SIZES, PREFILL_STEP] and sorted(output) == list(STEP_SIZES)
    assert layers[8] < layers[PREFILL_STEP] < 1.25 * layers[8] * PREFILL_STEP / 8


def test_local_figures_without_the_prompt_chunk_are_measured_again(tmp_path, session_cache):
    # a cache entry of the small steps only (as this machine's figures were once kept) is
    # not used: the figures are measured with the prompt chunk
    import socket

    from support.tinymodel import write_tiny_llama
    model = write_tiny_llama(tmp_path / "fresh.gguf", n_layer=2, seed=23)
    old = (session_cache / "profiles" / f"local-layers-{'-'.join(map(str, STEP_SIZES))}-"
           f"{socket.gethostname()}-{content_digest(model)[:24]}.json")
    old.parent.mkdir(parents=True, exist_ok=True)
    old.write_text(json.dumps({"layer_ms": {b: 1.0 for b in STEP_SIZES},
                               "output_ms": {b: 1.0 for b in STEP_SIZES}}))
    layers, output = modelled.local_layers(model)
    assert sorted(layers) == [*STEP_SIZES, PREFILL_STEP] and layers[1] != 1.0
    assert modelled.local_layers(model) == (layers, output)   # kept: measured once


def pipeinfer(*args, timeout=120):
    return launch([PIPEINFER, *map(str, args)], timeout=timeout)


def test_simulate_reports_ttft_for_the_prompt_length(tiny_model):
    def sim(*extra):
        out = pipeinfer("simulate", "--nodes", 3, "--cpu", 0.5, "-m", tiny_model,
                        "--strategy", "iterative", "-n", 8, *extra)
        assert out.rc == 0, out.describe()
        return out

    text = sim("--prompt-len", 300).stdout
    assert "for a 300-token prompt" in text and "TTFT" in text and "t/s prefill" in text
    short, long = (sim("--prompt-len", n, "--json").json for n in (32, 1024))
    assert short["prompt_len"] == 32 and long["prompt_len"] == 1024
    assert long["ttft_s"] > short["ttft_s"] > 0 and long["prefill_tps"] > 0
    assert sim("--json").json["prompt_len"] == 32   # the default: a short question
    assert sim("--prompt-len", 1024, "--prefill-chunk", 64, "--json").json["prefill_chunk"] == 64


def test_plan_shows_ttft_and_prefill_speed(tiny_model):
    out = pipeinfer("plan", "--nodes", 3, "--cpu", 0.5, "-m", tiny_model, "--strategy",
                    "iterative", "--prompt-len", 700, "--prefill-chunk", 32)
    assert out.rc == 0, out.describe()
    assert "a 700-token prompt in batches of 32 tokens" in out.stdout
    assert "prefill t/s" in out.stdout and "TTFT ms" in out.stdout
    assert "--prefill-chunk 32" in out.stdout    # run evaluates the prompt as modelled
    row = pipeinfer("plan", "--nodes", 3, "--cpu", 0.5, "-m", tiny_model, "--strategy",
                    "iterative", "--prompt-len", 700, "--json").json
    assert row["prompt_len"] == 700 and row["ttft_s"] > 0 and row["prefill_tps"] > 0
    assert "--prefill-chunk" not in row["command"]    # run's default


def test_a_profile_without_the_prompt_chunk_says_to_calibrate(tiny_model, tmp_path):
    nodes = tuple(NodeFigures(r, f"host{r}", 1, {b: 1.0 + b / 8 for b in STEP_SIZES},
                              {1: 0.5, 8: 1.0}, 10000.0, 0.2, 100.0) for r in range(3))
    profile = tmp_path / "small-steps.json"
    Profile(ModelId(tiny_model.name, content_digest(tiny_model)[:32], 4), None, nodes).save(
        profile)
    args = ["--profile", profile, "-m", tiny_model, "--strategy", "iterative", "-n", 8]
    for command in ("simulate", "plan"):
        out = pipeinfer(command, *args)
        errors = [l for l in out.stderr.splitlines() if l.startswith("pipeinfer: error:")]
        assert out.rc != 0 and len(errors) == 1, out.describe()
        assert "`pipeinfer calibrate`" in errors[0] and "--prompt-len 8 or less" in errors[0]
    assert pipeinfer("simulate", *args, "--prompt-len", 8).rc == 0
