"""A lost stage's layers handed to its neighbours (model/handover.py), the split a job uses
after a host was lost (job/takeover.py, front/takeover.py), and a stage's KV cells put together
layer by layer from other stages' copies (model/kv_state.py, job/assemble.py): on real
llama.cpp stages of a real model, the assembled cells are byte for byte those a stage of
those layers computes, and the next token's logits the same; copies of another build,
another model's layers or of other cells are never used."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from pipeinfer.front.launcher import Host, placed
from pipeinfer.front.takeover import takeover_env
from pipeinfer.job.assemble import StageCopies
from pipeinfer.job.takeover import takeover_fractions
from pipeinfer.model import kv_state
from pipeinfer.model.balance import balanced_split, layer_bytes
from pipeinfer.model.embedding import Embedder
from pipeinfer.model.handover import (KEPT_ENV, handover, kept_env, kept_split, replica_plan,
                                      worth_keeping)
from pipeinfer.model.kept_cells import Kept, KeptCells, identity_of, token_digest
from pipeinfer.model.partition import StageRange, partition
from pipeinfer.model.slicing import model_info, open_model, read_model, write_stage
from pipeinfer.model.stage import Stage, StageConfig


def ranges(*bounds: int, head: int = 0) -> list[StageRange]:
    """The head with layers [0, head), then a worker per pair of bounds."""
    spans = [(0, head)] + list(zip(bounds, bounds[1:]))
    return [StageRange(r, f, l, r == len(spans) - 1) for r, (f, l) in enumerate(spans)]


# --- who takes over what -----------------------------------------------------------------
def test_a_middle_stage_is_shared_by_both_neighbours_where_they_weigh_alike():
    old = ranges(0, 11, 23, 28)   # Qwen2.5 1.5B's split on 4 nodes, the head drafting
    per_layer, final = [10] * 28, 55   # the output weighs 5.5 layers
    assert handover(old, 2, per_layer, final) == [(1, 11, 17), (3, 17, 23)]
    # the split after its host is lost: each survivor keeps its layers, grown
    assert kept_split(old, [0, 1, 3], per_layer, final) == [(0, 0), (0, 17), (17, 28)]


def test_the_first_and_last_workers_go_to_their_one_neighbour():
    old = ranges(0, 11, 23, 28)
    per_layer, final = [10] * 28, 55
    assert handover(old, 1, per_layer, final) == [(2, 0, 11)]    # (the head drafts)
    assert handover(old, 3, per_layer, final) == [(2, 23, 28)]
    assert handover(old, 0, per_layer, final) == []              # the head: never
    plan = replica_plan(old, per_layer, final)
    assert plan == {1: [(2, 0, 11)], 2: [(1, 11, 17), (3, 17, 23)], 3: [(2, 23, 28)]}


def test_a_split_is_kept_only_when_one_worker_was_lost_and_the_head_stays():
    old = ranges(0, 11, 23, 28)
    per_layer, final = [10] * 28, 55
    assert kept_split(old, [1, 2, 3], per_layer, final) is None       # the head's host
    assert kept_split(old, [0, 3], per_layer, final) is None          # two lost
    assert kept_split(old, [0, 1, 2, 3], per_layer, final) == [(0, 0), (0, 11), (11, 23),
                                                                (23, 28)]   # none lost
    two = ranges(0, 28)
    assert kept_split(two, [0], per_layer, final) is None             # no neighbour


def test_a_kept_split_much_heavier_than_the_balanced_one_is_not_worth_it():
    per_layer, final = [10] * 28, 55
    balanced = ranges(0, 17, 28)   # heaviest: 170 (and 110 + 55)
    assert worth_keeping([(0, 0), (0, 17), (17, 28)], balanced, per_layer, final)
    assert worth_keeping([(0, 0), (0, 21), (21, 28)], balanced, per_layer, final)  # 210
    assert not worth_keeping([(0, 0), (0, 22), (22, 28)], balanced, per_layer, final)  # 220


# --- what the front says, and what the job makes of it -------------------------------------
def test_the_front_names_the_surviving_ranks_by_host():
    hosts = [Host(f"node{i}") for i in range(4)]
    last = {"ranks": [{"rank": 0, "role": "head", "layers": None},
                      {"rank": 1, "role": "stage", "layers": [0, 11]},
                      {"rank": 2, "role": "stage", "layers": [11, 23]},
                      {"rank": 3, "role": "stage", "layers": [23, 28]}]}
    before = placed(hosts, 4)
    now = placed([h for h in hosts if h.name != "node2"], 3)
    env = takeover_env((last, before), now)
    assert json.loads(env[KEPT_ENV]) == {"ranges": [[0, 0], [0, 11], [11, 23], [23, 28]],
                                         "survivors": [0, 1, 3]}
    assert takeover_env(None, now) == {}                               # none was ready
    assert takeover_env((last, before), placed([Host("other")] + hosts[1:2], 2)) == {}
    assert placed([Host("a", 2), Host("b")], 5) == ["a", "a", "b", "a", "a"]


def test_the_job_keeps_the_layers_where_they_were_or_says_why_not(smollm2, caplog):
    header = read_model(smollm2)
    n_layer = model_info(header, smollm2).n_layer   # 30; the head holds layers (no draft)
    old = partition(n_layer, balanced_split(header, n_layer, 4, True))
    balanced = balanced_split(header, n_layer, 3, True)
    spans = [(r.first, r.last) for r in old]
    caplog.set_level(logging.INFO)
    env = {KEPT_ENV: kept_env(spans, [0, 1, 3])}
    fractions = takeover_fractions(header, n_layer, balanced, env)
    got = [(r.first, r.last) for r in partition(n_layer, fractions, allow_empty=True)]
    per_layer, final = layer_bytes(header, n_layer)
    assert got == kept_split(old, [0, 1, 3], per_layer, final)
    assert got[0] == spans[0] and got[1][0] == spans[1][0] and got[2][1] == n_layer
    assert "every surviving rank keeps its layers" in caplog.text
    lost_head = {KEPT_ENV: kept_env(spans, [1, 2, 3])}
    assert takeover_fractions(header, n_layer, balanced, lost_head) is None
    assert "balanced, every request evaluated again (the head's rank was lost" in caplog.text
    assert takeover_fractions(header, n_layer, balanced, {KEPT_ENV: "{"}) is None


# --- cells assembled by layer, on real stages ------------------------------------------------
STAMP = ("model", "settings")
CFG = StageConfig(n_ctx=256, n_batch=64)


@pytest.fixture(scope="module")
def smol_stages(smollm2, tmp_path_factory):
    """SmolLM2 as one stage and as two stages cut at layer 12, with a 40-token prompt
    evaluated in the two (its cells kept in the stages, returned with the embedder)."""
    out = tmp_path_factory.mktemp("handover")
    reader = open_model(smollm2)
    info = model_info(reader, smollm2)
    cut, n = 12, info.n_layer
    files = {}
    for name, rng in {"a": StageRange(0, 0, cut, False), "b": StageRange(1, cut, n, True),
                      "whole": StageRange(0, 0, n, True)}.items():
        files[name] = out / f"{name}.gguf"
        write_stage(reader, info, rng, files[name])
    return files, Embedder(smollm2), cut, n


def _evaluate(stages, embed, tokens, start=0):
    x = embed(tokens)
    pos = list(range(start, start + len(tokens)))
    for stage in stages:
        x = stage.decode(pos, [(0,)] * len(tokens), embd=x)
    return x


def test_cells_joined_by_layer_are_the_bits_one_stage_computes(smol_stages):
    files, embed, cut, n = smol_stages
    prompt = list(range(100, 140))
    with Stage(files["a"], CFG, final=False) as a, Stage(files["b"], CFG, final=True) as b, \
            Stage(files["whole"], CFG, final=True) as whole, \
            Stage(files["whole"], CFG, final=True) as fresh:
        _evaluate([a, b], embed, prompt)
        parts = [kv_state.parse(a.seq_state(0)), kv_state.parse(b.seq_state(0))]
        assert [p.n_layer for p in parts] == [cut, n - cut]
        assert parts[0].to_bytes() == a.seq_state(0)    # (taken apart and put back: as was)
        joined = kv_state.join(parts).first(30)         # the cells of positions 0-29
        assert whole.set_seq_state(0, joined.to_bytes())
        _evaluate([fresh], embed, prompt[:30])
        assert fresh.seq_state(0) == whole.seq_state(0)
        assert np.array_equal(_evaluate([whole], embed, prompt[30:], 30),
                              _evaluate([fresh], embed, prompt[30:], 30))


@pytest.fixture
def stores(tmp_path):
    def store(layers, sub="", stamp=STAMP):
        return KeptCells(tmp_path / sub, identity_of(*stamp, *layers), layers)
    return store


def _copy(stage, key, n, layers, stamp=STAMP, tokens=range(100, 140)):
    return Kept(key, n, token_digest(list(tokens)[:n]), 0, (), stage.seq_state(0),
                identity_of(*stamp, *layers), layers)


def test_a_stage_takes_its_cells_from_its_own_copy_and_a_neighbours(smol_stages, stores):
    files, embed, cut, n = smol_stages
    prompt = list(range(100, 140))
    with Stage(files["a"], CFG, final=False) as a, Stage(files["b"], CFG, final=True) as b, \
            Stage(files["whole"], CFG, final=True) as whole:
        _evaluate([a, b], embed, prompt)
        _evaluate([whole], embed, prompt)
        own, held = stores((cut, n)), stores((0, 0), "replicas")
        own.write(_copy(b, 7, 40, (cut, n)))          # the copy it kept of its last stage
        held.write(_copy(a, 7, 32, (0, cut)))         # its neighbour's, of an earlier save
        now = StageCopies(stores((0, n)), held, STAMP)
        copy, why = now.copy_of(7)
        assert why == "" and copy.n == 32 and copy.digest == token_digest(prompt[:32])
        expected = kv_state.parse(whole.seq_state(0)).first(32).to_bytes()
        assert copy.body == expected
        assert now.own.read(7)[0].body == expected    # (kept as this stage's own from now)


def test_copies_of_another_build_or_other_layers_are_never_assembled(smol_stages, stores):
    files, embed, cut, n = smol_stages
    with Stage(files["a"], CFG, final=False) as a, Stage(files["b"], CFG, final=True) as b:
        _evaluate([a, b], embed, list(range(100, 140)))
        held = stores((0, 0), "replicas")
        held.write(_copy(a, 7, 40, (0, cut), stamp=("model", "another build")))
        held.write(_copy(b, 7, 40, (cut, n)))
        copy, why = StageCopies(stores((0, n)), held, STAMP).copy_of(7)
        assert copy is None and why == "no copy of layer 0"
        held.write(_copy(a, 8, 40, (0, cut)))
        held.write(_copy(a, 8, 40, (cut, n)))         # (another stage's cells under the
        copy, why = StageCopies(stores((0, n)), held, STAMP).copy_of(8)   # name of these
        assert copy is None                                               # layers)
        held.path(8, identity_of(*STAMP, 0, cut)).write_bytes(b"PIKC2\n")  # truncated
        copy, why = StageCopies(stores((0, n)), held, STAMP).copy_of(8)
        assert copy is None and why == "no copy of layer 0"
