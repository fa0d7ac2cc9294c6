"""Sampling on the head (pipeinfer.model.sampling) and the losslessness of speculation under it.

This design draws exactly one sample per generated position, in order, from the target's own
distribution, and accepts a drafted token only if it equals that sample. So with the same seed
the `speculative` and `pipeinfer` strategies must give the very tokens `iterative` gives, and
the distribution of generated tokens is the target's.
"""

from __future__ import annotations

import ctypes
import math
import os
from collections import Counter
from typing import Sequence

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support import mpi_util
from pipeinfer.model.sampling import Sampler, SamplingParams
from pipeinfer.model.stage import Stage, StageConfig
from pipeinfer.schedule.options import SpecOptions
from support.rig import Rig
from support.scripted_draft import ScriptedDraft, draft_plans
from support.stepped_transport import SteppedTransport
from support.tiny_set import N_BATCH, N_CTX, PROMPT

SPEC_STRATEGIES = ("speculative", "pipeinfer")


def softmax(x: np.ndarray, temp: float = 1.0) -> np.ndarray:
    z = x.astype(np.float64) / temp
    z = np.exp(z - z.max())
    return z / z.sum()


# --- chi-square without scipy -----------------------------------------------------------------

ALPHA = 0.001
Z_ALPHA = 3.090232  # standard normal quantile for an upper tail of ALPHA


def chi2_critical(df: int) -> float:
    """Upper ALPHA critical value of the chi-square distribution: scipy's if installed, else
    the Wilson-Hilferty approximation (within 2% for df >= 3 at this tail)."""
    try:
        from scipy.stats import chi2
    except ImportError:
        a = 2.0 / (9.0 * df)
        return df * (1.0 - a + Z_ALPHA * math.sqrt(a)) ** 3
    return float(chi2.isf(ALPHA, df))


def chi_square(observed: Counter, expected_p: dict, n: int, min_expected: float = 5.0):
    """Chi-square statistic and degrees of freedom of observed counts against probabilities
    (outcome -> p; the outcomes not listed share the remaining mass). Bins with an expected
    count under `min_expected` are merged into one rest bin (dropped if it is still small and
    empty-ish: then it is merged into the smallest kept bin)."""
    kept = {k: p for k, p in expected_p.items() if p * n >= min_expected}
    rest_p = max(0.0, 1.0 - sum(kept.values()))
    bins = [(observed.get(k, 0), p * n) for k, p in kept.items()]
    rest_obs = n - sum(o for o, _ in bins)
    if rest_p * n >= min_expected or not bins:
        bins.append((rest_obs, rest_p * n))
    else:  # too little mass outside the kept bins: fold it into the smallest one
        i = min(range(len(bins)), key=lambda j: bins[j][1])
        bins[i] = (bins[i][0] + rest_obs, bins[i][1] + rest_p * n)
    stat = sum((o - e) ** 2 / e for o, e in bins if e > 0)
    return stat, len(bins) - 1, bins


def test_chi2_critical_values():
    # table values at alpha 0.001
    table = {3: 16.266, 5: 20.515, 10: 29.588, 20: 45.315, 30: 59.703}
    for df, value in table.items():
        assert chi2_critical(df) == pytest.approx(value, rel=0.02)


def test_chi_square_detects_mismatch():
    rng = np.random.default_rng(1)
    p = np.array([0.5, 0.3, 0.15, 0.05])
    draws = Counter(rng.choice(4, size=2000, p=p).tolist())
    stat, df, _ = chi_square(draws, dict(enumerate(p)), 2000)
    assert stat < chi2_critical(df)
    wrong = dict(enumerate([0.4, 0.4, 0.15, 0.05]))
    stat, df, _ = chi_square(draws, wrong, 2000)
    assert stat > chi2_critical(df)


# --- the Sampler --------------------------------------------------------------------------------

LOGITS = np.array([2.0, 1.0, 0.5, 3.0, -1.0, 0.0, 2.5, -3.0], dtype=np.float32)


def test_greedy_is_argmax_and_ignores_seed():
    for seed in range(5):
        s = Sampler(SamplingParams(temp=0.0, seed=seed))
        assert s.sample(LOGITS) == 3
        d = s.distribution(LOGITS)
        assert d[3] == 1.0 and d.sum() == 1.0
    assert SamplingParams(temp=0.0).greedy and SamplingParams(temp=-1).greedy
    assert not SamplingParams(temp=0.1).greedy


def test_greedy_tie_takes_first():
    assert Sampler(SamplingParams()).sample(np.array([1.0, 5.0, 5.0], np.float32)) == 1


def test_temperature_is_softmax():
    for temp in (0.5, 1.0, 2.0):
        d = Sampler(SamplingParams(temp=temp, top_k=0, top_p=1.0)).distribution(LOGITS)
        np.testing.assert_allclose(d, softmax(LOGITS, temp), rtol=1e-12, atol=1e-15)


def test_top_k():
    d = Sampler(SamplingParams(temp=1.0, top_k=3, top_p=1.0)).distribution(LOGITS)
    assert set(np.flatnonzero(d)) == {3, 6, 0}
    top = softmax(LOGITS[[3, 6, 0]])
    np.testing.assert_allclose(d[[3, 6, 0]], top, rtol=1e-12)
    d1 = Sampler(SamplingParams(temp=5.0, top_k=1, top_p=1.0)).distribution(LOGITS)
    assert d1[3] == 1.0
    big = Sampler(SamplingParams(temp=1.0, top_k=1000, top_p=1.0)).distribution(LOGITS)
    np.testing.assert_allclose(big, softmax(LOGITS), rtol=1e-12)


def test_top_p_keeps_smallest_covering_set():
    p = softmax(LOGITS)
    order = np.argsort(-p)
    cum = np.cumsum(p[order])
    for top_p in (0.3, 0.5, 0.8, 0.95, 0.999):
        d = Sampler(SamplingParams(temp=1.0, top_k=0, top_p=top_p)).distribution(LOGITS)
        keep = int(np.argmax(cum >= top_p)) + 1      # smallest prefix reaching top_p
        assert set(np.flatnonzero(d)) == set(order[:keep].tolist())
        np.testing.assert_allclose(d[order[:keep]], p[order[:keep]] / p[order[:keep]].sum(),
                                   rtol=1e-12)


@settings(max_examples=60, deadline=None)
@given(logits=st.lists(st.floats(-20, 20), min_size=2, max_size=40),
       temp=st.floats(0.05, 5.0), top_k=st.integers(0, 50), top_p=st.floats(0.05, 1.0))
def test_distribution_properties(logits, temp, top_k, top_p):
    x = np.array(logits, dtype=np.float32)
    d = Sampler(SamplingParams(temp=temp, top_k=top_k, top_p=top_p)).distribution(x)
    assert d.shape == x.shape and np.all(d >= 0)
    assert d.sum() == pytest.approx(1.0, abs=1e-9)
    support = np.flatnonzero(d)
    assert 1 <= len(support) <= (top_k or len(x))
    # the argmax always survives, and kept tokens are the most likely ones
    assert d[int(np.argmax(x))] > 0
    assert x[support].min() >= x[np.setdiff1d(np.arange(len(x)), support)].max(initial=-np.inf)
    # probabilities follow the logit order
    kept = support[np.argsort(-x[support], kind="stable")]
    assert np.all(np.diff(d[kept]) <= 1e-12)


def test_seeded_sampler_reproducible():
    params = SamplingParams(temp=0.8, top_k=0, top_p=1.0, seed=42)
    a, b = Sampler(params), Sampler(params)
    seq_a = [a.sample(LOGITS) for _ in range(200)]
    seq_b = [b.sample(LOGITS) for _ in range(200)]
    assert seq_a == seq_b
    c = Sampler(SamplingParams(temp=0.8, top_k=0, top_p=1.0, seed=43))
    assert [c.sample(LOGITS) for _ in range(200)] != seq_a


def test_sampler_frequencies_match_distribution():
    params = SamplingParams(temp=1.3, top_k=6, top_p=0.97, seed=7)
    s = Sampler(params)
    n = 4000
    counts = Counter(s.sample(LOGITS) for _ in range(n))
    d = s.distribution(LOGITS)
    assert set(counts) <= set(np.flatnonzero(d).tolist())
    stat, df, _ = chi_square(counts, {i: float(p) for i, p in enumerate(d) if p > 0}, n)
    assert stat < chi2_critical(df)


# --- strategies under temperature sampling ------------------------------------------------------

TEMP = SamplingParams(temp=0.8, top_k=40, top_p=0.95)


def _sampling(seed: int, base: SamplingParams = TEMP) -> SamplingParams:
    return SamplingParams(base.temp, base.top_k, base.top_p, seed)


@pytest.fixture(scope="module")
def rigs(tiny):
    """In-process pipelines (head slice + 2 workers) with each draft, loaded once."""
    spec = SpecOptions(draft_thread=False, n_parallel=2, p_split=0.1)
    opened = {name: Rig(tiny, getattr(tiny, name), spec=spec) for name in ("aligned", "unrelated")}
    yield opened
    for rig in opened.values():
        rig.close()


def _lagged(lag: int):
    return lambda stages: SteppedTransport(stages, lag=lag)


@pytest.mark.parametrize("draft", ["aligned", "unrelated"])
@pytest.mark.parametrize("strategy", SPEC_STRATEGIES)
def test_temperature_same_tokens_as_iterative(rigs, strategy, draft):
    rig = rigs[draft]
    accepted = 0
    for seed in range(6):
        sampling = _sampling(seed)
        want = rig.run("iterative", sampling=sampling, n_predict=24).gen.tokens
        for lag in (0, 2):
            out = rig.run(strategy, sampling=sampling, n_predict=24, transport=_lagged(lag))
            assert out.gen.tokens == want, (seed, lag)
            assert out.pool.all_free
            accepted += out.counters.n_accepted
    if draft == "aligned":
        assert accepted > 0  # speculation did accept drafted tokens under sampling


@pytest.mark.parametrize("strategy", SPEC_STRATEGIES)
def test_seeded_runs_reproducible(rigs, strategy):
    rig = rigs["aligned"]
    runs = [rig.run(strategy, sampling=_sampling(s), n_predict=24, transport=_lagged(1)).gen.tokens
            for s in (5, 5, 6)]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


@pytest.mark.slow
def test_seeded_cli_reproducible_and_matches_iterative(tiny):
    """The real command (3 MPI ranks, head holding no layers) at --temp 0.8."""
    common = ["-md", str(tiny.aligned), "--temp", "0.8", "-s", "11", "--ignore-eos",
              "--layer-split", "0,0.5,0.5"]
    results = {}
    for strategy in ("iterative", "pipeinfer", "speculative", "pipeinfer"):
        launch = mpi_util.run_pipeinfer(3, tiny.target, PROMPT, "--strategy", strategy, *common,
                                        n_predict=40, timeout=120)
        assert launch.rc == 0 and launch.json, launch.describe()
        results.setdefault(strategy, []).append(launch.json["tokens"])
    assert results["pipeinfer"][0] == results["pipeinfer"][1] == results["iterative"][0]
    assert results["speculative"][0] == results["iterative"][0]


@pytest.fixture(scope="module")
def scripted_rig(tiny):
    """A pipeline for scripted drafts, wide enough for 3 branches x 8 partitions."""
    rig = Rig(tiny, None, spec=SpecOptions(draft_thread=False, n_parallel=3, partitions=8))
    yield rig
    rig.close()


@settings(max_examples=int(os.environ.get("SPEC_PROPERTY_EXAMPLES", 25)), deadline=None,
          suppress_health_check=list(HealthCheck))
@given(strategy=st.sampled_from(SPEC_STRATEGIES), seed=st.integers(0, 2**16),
       temp=st.sampled_from([0.5, 0.8, 1.5]),
       plans=st.lists(draft_plans, min_size=1, max_size=12),
       schedule=st.lists(st.integers(0, 3), max_size=60), lag=st.integers(0, 3),
       n_parallel=st.integers(1, 3), draft_max=st.integers(1, 4),
       max_runs=st.integers(2, 6), partitions=st.integers(1, 8))
def test_sampling_property_matches_iterative(tiny, scripted_rig, strategy, seed, temp, plans,
                                             schedule, lag, n_parallel, draft_max, max_runs,
                                             partitions):
    """Drafts scripted around the iterative strategy's own sampled continuation (so that
    verified drafts get accepted) or going wrong at chosen places, under random pipeline
    timing: the sampled tokens are those of `iterative` with the same seed."""
    sampling = SamplingParams(temp, 40, 0.95, seed)
    want = scripted_rig.run("iterative", sampling=sampling, n_predict=20).gen.tokens
    spec = SpecOptions(draft_thread=False, draft=draft_max, n_parallel=n_parallel, max_runs=max_runs,
                       partitions=partitions, p_accept=0.0, p_recovery=0.0, p_decay=0.0)
    draft = ScriptedDraft(tiny.prompt + tuple(want), tiny.n_vocab, plans)
    out = scripted_rig.run(strategy, sampling=sampling, n_predict=20, draft=draft, spec=spec,
                           transport=lambda stages: SteppedTransport(stages, lag=lag,
                                                                     script=schedule))
    assert out.gen.tokens == want
    assert out.pool.all_free


# --- the distribution of generated tokens -------------------------------------------------------

N_SEEDS = 200
FLAT = SamplingParams(temp=1.0, top_k=0, top_p=1.0)


def first_token_distribution(tiny, temp: float) -> np.ndarray:
    """The whole target's softmax after the prompt."""
    with Stage(tiny.target, StageConfig(n_ctx=N_CTX, n_batch=N_BATCH, n_seq_max=1),
               final=True) as stage:
        n = len(tiny.prompt)
        logits = stage.decode(list(range(n)), [(0,)] * n, tokens=list(tiny.prompt))[-1]
    return softmax(logits, temp)


def pit_values(tiny, generations: Sequence[Sequence[int]], temp: float, seed: int = 0):
    """Randomized probability integral transform of every generated token under the whole
    target's conditional distribution given the tokens before it: u = F(t - 1) + V p(t), with
    F the cumulative distribution over token ids and V ~ U(0, 1). If the tokens follow the
    target's distribution, the u values of a sequence are iid uniform (Rosenblatt), so all
    of them together must look uniform, whatever the prefixes were."""
    rng = np.random.default_rng(seed)
    u = []
    with Stage(tiny.target, StageConfig(n_ctx=N_CTX, n_batch=N_BATCH, n_seq_max=1),
               final=True) as stage:
        n = len(tiny.prompt)
        first = stage.decode(list(range(n)), [(0,)] * n, tokens=list(tiny.prompt))[-1]
        for tokens in generations:
            stage.seq_rm(0, n, -1)
            logits = first
            for i, t in enumerate(tokens):
                p = softmax(logits, temp)
                u.append(float(p[:t].sum() + rng.random() * p[t]))
                if i + 1 < len(tokens):
                    logits = stage.decode([n + i], [(0,)], tokens=[t])[-1]
    return np.clip(np.array(u), 0.0, 1.0)


def test_pit_detects_wrong_distribution(tiny):
    """The PIT check has power: greedy tokens (not samples) fail it."""
    greedy = [list(tiny.reference[:8])] * 50
    u = pit_values(tiny, greedy, FLAT.temp)
    counts = Counter(np.minimum((u * 20).astype(int), 19).tolist())
    stat, df, _ = chi_square(counts, {b: 1 / 20 for b in range(20)}, len(u))
    assert stat > chi2_critical(df)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", SPEC_STRATEGIES)
def test_token_distribution_matches_target(tiny, rigs, strategy):
    """Over N_SEEDS seeds (temp 1, no top-k/top-p): the first generated token (sampled from
    the prefill logits) follows the target's softmax, and every generated token follows the
    target's conditional distribution given its prefix (tokens 3+ come from logits of
    speculative runs whenever a draft was verified)."""
    rig = rigs["aligned"]
    n_predict = 8
    generations, accepted = [], 0
    for seed in range(N_SEEDS):
        out = rig.run(strategy, sampling=_sampling(seed, FLAT), n_predict=n_predict,
                      transport=_lagged(1))
        generations.append(out.gen.tokens)
        accepted += out.counters.n_accepted
    assert accepted > 0  # verified draft tokens took part

    p1 = first_token_distribution(tiny, FLAT.temp)
    firsts = Counter(g[0] for g in generations)
    stat, df, bins = chi_square(firsts, {t: float(p) for t, p in enumerate(p1)}, N_SEEDS)
    assert df >= 2, f"too few bins to test: {bins}"
    assert stat < chi2_critical(df), (stat, df, bins)

    u = pit_values(tiny, generations, FLAT.temp)
    n_bins = 20
    counts = Counter(np.minimum((u * n_bins).astype(int), n_bins - 1).tolist())
    stat, df, bins = chi_square(counts, {b: 1 / n_bins for b in range(n_bins)}, len(u))
    assert stat < chi2_critical(df), (stat, df, bins)


# --- llama.cpp's chain: logit bias, penalties, min-p ---------------------------------------------

def _llama_cpp_adjusted(logits: np.ndarray, window: list[int], params: SamplingParams):
    """The logits after llama.cpp's own logit-bias and penalties samplers (the window's
    tokens accepted first, as llama-server feeds its sampler)."""
    import llama_cpp

    n = len(logits)
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    if params.logit_bias:
        biases = (llama_cpp.llama_logit_bias * len(params.logit_bias))(
            *(llama_cpp.llama_logit_bias(t, b) for t, b in params.logit_bias))
        llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_logit_bias(
            n, len(params.logit_bias), biases))
    llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_penalties(
        n, params.repeat_last_n, params.repeat_penalty, params.frequency_penalty,
        params.presence_penalty))
    for token in window:
        llama_cpp.llama_sampler_accept(chain, token)
    data = (llama_cpp.llama_token_data * n)(
        *(llama_cpp.llama_token_data(i, float(x), 0.0) for i, x in enumerate(logits)))
    arr = llama_cpp.llama_token_data_array(data, n, -1, False)
    llama_cpp.llama_sampler_apply(chain, ctypes.byref(arr))
    out = np.array([arr.data[i].logit for i in range(arr.size)], dtype=np.float32)
    ids = np.array([arr.data[i].id for i in range(arr.size)])
    llama_cpp.llama_sampler_free(chain)
    return out[np.argsort(ids)]


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), last_n=st.integers(1, 40),
       repeat=st.floats(0.5, 2.0), freq=st.floats(-2, 2), presence=st.floats(-2, 2),
       n_bias=st.integers(0, 3))
def test_penalties_and_bias_equal_llama_cpps_samplers(seed, last_n, repeat, freq, presence,
                                                      n_bias):
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal(64) * 4).astype(np.float32)
    window = [int(t) for t in rng.integers(0, 64, 50)]
    bias = tuple((int(t), float(b)) for t, b in zip(rng.integers(0, 64, n_bias),
                                                    rng.uniform(-100, 100, n_bias)))
    params = SamplingParams(repeat_penalty=repeat, frequency_penalty=freq,
                            presence_penalty=presence, repeat_last_n=last_n, logit_bias=bias)
    sampler = Sampler(params, history=lambda n: window[len(window) - n:])
    np.testing.assert_array_equal(sampler.adjusted(logits),
                                  _llama_cpp_adjusted(logits, window, params))


def test_greedy_takes_the_adjusted_argmax_and_observers_see_raw_logits():
    seen = []
    params = SamplingParams(logit_bias=((3, -100.0),))   # bans the argmax (3)
    sampler = Sampler(params, observe=lambda logits, token: seen.append((logits, token)))
    assert sampler.sample(LOGITS) == 6
    assert seen[0][0] is LOGITS and seen[0][1] == 6
    params = SamplingParams(repeat_penalty=10.0, repeat_last_n=2)
    assert Sampler(params, history=lambda n: [5, 3][-n:]).sample(LOGITS) == 6
    with pytest.raises(ValueError):
        Sampler(params)   # penalties need the tokens before each position


def test_min_p_keeps_tokens_as_likely_as_a_share_of_the_best():
    p = softmax(LOGITS)
    for min_p in (0.05, 0.3, 0.6, 1.0):
        d = Sampler(SamplingParams(temp=1.0, top_k=0, top_p=1.0, min_p=min_p)
                    ).distribution(LOGITS)
        keep = set(np.flatnonzero(p >= min_p * p.max() * (1 - 1e-6)).tolist())
        assert set(np.flatnonzero(d).tolist()) == keep
    hot = Sampler(SamplingParams(temp=2.0, top_k=0, top_p=1.0, min_p=0.3)).distribution(LOGITS)
    assert set(np.flatnonzero(hot).tolist()) == set(np.flatnonzero(p >= 0.3 * p.max()).tolist())
