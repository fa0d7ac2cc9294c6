"""The driver as a token stream (Driver.stream, Head.stream): tokens come out as they are
accepted, and a consumer that stops early cancels the generation without leaving anything in
the pipeline (every run accounted for on every stage, every partition back, sequence 0
holding accepted tokens only)."""

from __future__ import annotations

import pytest

from pipeinfer.engine.drafting.drafter import Drafter
from pipeinfer.engine.head.generate import Drafting, driver_for
from pipeinfer.engine.head.pipeline import Pipeline
from pipeinfer.model.sampling import Sampler, SamplingParams
from pipeinfer.schedule.generation import Generation, Request
from support.rig import Rig
from support.stepped_transport import SteppedTransport
from support.tiny_set import N_BATCH

N_PREDICT = 24


def _driver(rig: Rig, strategy: str, n_predict: int = N_PREDICT):
    for stage in rig.stages:
        stage.clear()
    cfg = rig._config(strategy, n_predict, SamplingParams())
    pool = cfg.pool()
    transport = SteppedTransport(rig.workers, lag=1)
    pipe = Pipeline(rig.embed, rig.head, transport)
    gen = Generation(Request(rig.tiny.prompt, n_predict, cfg.n_ctx, ignore_eos=True),
                     lambda t: False)
    drafter = Drafter(rig.draft_stage, N_BATCH) if strategy != "iterative" else None
    return driver_for(strategy, pipe, gen, Sampler(SamplingParams()), cfg, Drafting(drafter), pool), \
        gen, pool, pipe


@pytest.mark.parametrize("strategy", ["iterative", "speculative", "pipeinfer"])
def test_stream_yields_the_tokens(tiny, strategy):
    with Rig(tiny, tiny.aligned) as rig:
        driver, gen, pool, pipe = _driver(rig, strategy)
        got = list(driver.stream())
        assert got == list(tiny.reference[:N_PREDICT]) == gen.tokens
        assert gen.stop_reason == "length" and (pool is None or pool.all_free)


@pytest.mark.parametrize("strategy", ["iterative", "speculative", "pipeinfer"])
@pytest.mark.parametrize("stop_after", [1, 5])
def test_stopping_early_cancels_and_drains(tiny, strategy, stop_after):
    with Rig(tiny, tiny.aligned) as rig:
        driver, gen, pool, pipe = _driver(rig, strategy)
        stream, got = driver.stream(), []
        for token in stream:
            got.append(token)
            if len(got) == stop_after:
                break
        stream.close()
        assert got == list(tiny.reference[:stop_after])
        assert gen.tokens[:stop_after] == got and len(gen.tokens) < N_PREDICT
        assert gen.stop_reason == "cancelled"
        assert driver.sched.in_flight == 0 and (pool is None or pool.all_free)
        stats = pipe.shutdown()
        started = gen.counters.runs_started
        for s in stats:  # every run reached every stage and was computed, skipped or aborted
            assert s["computed"] + s["skipped"] + s["aborted"] == started, (s, started)
        n_accepted = len(tiny.prompt) + len(gen.tokens)
        assert all(st.seq_pos_max(0) < n_accepted for st in rig.workers)
