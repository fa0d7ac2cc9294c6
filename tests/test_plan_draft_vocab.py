"""`simulate` and `plan` model the draft the head of the job they describe will run: with
--draft-vocab (auto by default, as `run`), its reduced-vocabulary copy, timed and probed as the
head feeds it (its full file's embeddings in, its columns mapped back to token ids), and the
command printed asks `run` for the same K where run's own auto would settle on another."""

from __future__ import annotations

import json

import numpy as np

from support.mpi_util import PIPEINFER, launch
from pipeinfer.model.draft_vocab import read_kept, reduced_draft
from pipeinfer.model.stage import Stage, StageConfig
from pipeinfer.model.stage_cache import content_digest
from pipeinfer.plan.acceptance import _prompt, accept_rate
from pipeinfer.plan.profile import ModelId, NodeFigures, Profile

K = 200   # of the tiny models' ~600 tokens


def pipeinfer(*args, timeout=180):
    return launch([PIPEINFER, *map(str, args)], timeout=timeout)


def _greedy(target, prompt: list[int], n: int) -> list[int]:
    config = StageConfig(n_ctx=len(prompt) + n + 8, n_batch=len(prompt) + n, n_seq_max=1)
    out: list[int] = []
    with Stage(target, config, final=True, label="oracle") as stage:
        logits = stage.decode(range(len(prompt)), [(0,)] * len(prompt), tokens=prompt)
        for i in range(n):
            out.append(int(np.argmax(logits[-1])))
            logits = stage.decode([len(prompt) + i], [(0,)], tokens=[out[-1]])
    return out


def test_probe_of_a_reduced_draft_is_the_full_draft_over_the_kept_tokens(
        tiny_model, tiny_draft_aligned):
    """The oracle: the full draft file fed token ids, its logits restricted to the kept
    tokens. The reduced copy's rows are those tokens' rows, so its greedy choice, mapped back,
    is the same token at every position; unmapped columns would be other ids."""
    n = 24
    reduced = reduced_draft(tiny_draft_aligned, K)
    kept = read_kept(reduced)
    rate = accept_rate(tiny_model, reduced, n, embeddings=tiny_draft_aligned)
    prompt = _prompt(tiny_model)
    generated = _greedy(tiny_model, prompt, n)
    text = prompt + generated[:-1]
    config = StageConfig(n_ctx=len(text) + 8, n_batch=len(text), n_seq_max=1)
    with Stage(tiny_draft_aligned, config, final=True, label="full draft") as stage:
        rows = [i >= len(prompt) - 1 for i in range(len(text))]
        logits = stage.decode(range(len(text)), [(0,)] * len(text), tokens=text,
                              logit_rows=rows)
    guesses = kept[np.argmax(logits[:, kept], axis=1)]
    expected = float(np.mean(guesses == np.array(generated)))
    assert rate == expected
    assert 0 < rate < 1 and not np.all(kept[:K] == np.arange(K))  # a real remap was needed


def test_simulate_models_the_draft_each_strategy_runs(tiny_model, tiny_draft_aligned):
    def sim(strategy, *extra):
        out = pipeinfer("simulate", "--nodes", 4, "--cpu", 0.5, "-m", tiny_model, "-md",
                        tiny_draft_aligned, "--strategy", strategy, "-n", 8, "--json", *extra)
        assert out.rc == 0, out.describe()
        return out.json

    # auto: the tiny draft's vocabulary is below 65,536 tokens, so run drafts over all of it
    assert sim("pipeinfer")["draft_vocab"] == 0
    assert sim("pipeinfer", "--draft-vocab", K)["draft_vocab"] == K
    assert sim("speculative", "--draft-vocab", K)["draft_vocab"] == K
    assert sim("iterative", "--draft-vocab", K)["draft_vocab"] == 0   # no draft at all


def test_a_profiles_draft_time_is_scaled_unless_it_timed_the_reduced_copy(
        tiny_model, tiny_draft_aligned, tmp_path):
    reduced = reduced_draft(tiny_draft_aligned, K)

    def sim_with_profile(draft_file):
        nodes = tuple(NodeFigures(r, f"host{r}", 1, {1: 1.0, 8: 2.0, 128: 9.0}, {1: 0.5, 8: 1.0},
                                  10000.0, 0.2, 100.0, draft_ms=0.5 if r == 0 else 0.0)
                      for r in range(4))
        profile = tmp_path / f"{draft_file.stem}.json"
        Profile(ModelId(tiny_model.name, content_digest(tiny_model)[:32], 4),
                ModelId(draft_file.name, content_digest(draft_file)[:32]), nodes).save(profile)
        out = pipeinfer("simulate", "--profile", profile, "-m", tiny_model, "-md",
                        tiny_draft_aligned, "--no-compact-draft", "--draft-vocab", K,
                        "--accept-rate", 0.8, "--strategy", "pipeinfer", "-n", 8, "--json")
        assert out.rc == 0, out.describe()
        return out.json["draft_ms"]

    assert sim_with_profile(reduced) == 0.5          # calibrated with the copy: as measured
    scaled = sim_with_profile(tiny_draft_aligned)    # with the full file: scaled to the copy
    assert 0 < scaled and scaled != 0.5


def test_plan_asks_run_for_the_k_it_modelled(tiny_model, tiny_draft_aligned):
    def commands(*extra):
        out = pipeinfer("plan", "--nodes", 4, "--cpu", 0.5, "-m", tiny_model, "-md",
                        tiny_draft_aligned, "--accept-rate", 0.8, "-n", 8,
                        "--strategy", "speculative,pipeinfer", "--json", *extra)
        assert out.rc == 0, out.describe()
        rows = [line for line in out.stdout.splitlines() if line.startswith("{")]
        return {r["strategy"]: r for r in map(json.loads, rows)}

    given = commands("--draft-vocab", K)
    for strategy in ("speculative", "pipeinfer"):
        assert given[strategy]["draft_vocab"] == K
        assert f"--draft-vocab {K}" in given[strategy]["command"]
    default = commands()
    for strategy in ("speculative", "pipeinfer"):
        assert default[strategy]["draft_vocab"] == 0
        assert "--draft-vocab" not in default[strategy]["command"]  # run's auto is the same
