"""The refill along a generation (engine/head/refill.py AlongRefill, model/stage.py's refill
contexts), for real.

A stage: a chunk evaluated in a slot's refill context, after it took the slot's exact cells
(while the slot's own context holds decode cells, a speculative sequence and holes besides),
gives a fresh evaluation's bits, and so does the slot once it took the refilled cells back.
On hosts whose kernels show it, the same chunk computed in the slot's own context behind
those cells does not: why the refill has a context of its own.

Served: `pipeinfer serve --ranks 3 --refill-along` (SmolLM2, 16-token chunks, iterative and
pipeinfer, the head with layers or without; Qwen2.5-Coder 0.5B with the default 64-token
chunks), every rank computing the refill's chunks behind its other runs: a conversation
whose every turn is asked as soon as the answer before it came reuses all the whole chunks
of its history, the answers included, with no idle refill, and every answer equals a fresh
evaluation's."""

from __future__ import annotations

import numpy as np
import pytest

from pipeinfer.model.models import ModelError, resolve_model
from pipeinfer.model.stage import Stage, StageConfig
from support.serving import KEY, Server, serving
from support.token_turns import (CODE, cached, complete, next_turn, text_and_logprobs,
                                 tokenize)

ASKS = ("\n\ndef merge(left, right):\n", "\n\n# tests\n", "\n\nclass Sorter:\n")
TOKENS = [(i * 7919) % 20000 + 100 for i in range(400)]


def qwen_small():
    try:
        return resolve_model("qwen-coder-0.5b", fetch_missing=False)
    except ModelError as err:
        pytest.skip(f"the Qwen models are not cached: {err}")


def _prompt(stage: Stage, upto: int) -> None:
    stage.clear()
    for s in range(0, upto, 64):
        stage.decode(list(range(s, s + 64)), [[0]] * 64, tokens=TOKENS[s:s + 64],
                     logit_rows=[False] * 64)


def _generated(stage: Stage) -> None:
    """Slot 0 after a prompt of 2 chunks and a 16-token tail, 40 decode steps, a speculative
    sequence's runs among them, that sequence dropped (holes)."""
    _prompt(stage, 128)
    stage.decode(list(range(128, 144)), [[0]] * 16, tokens=TOKENS[128:144])
    stage.seq_cp(0, 2, 0, 144)
    for k in range(40):
        stage.decode([144 + k], [[0]], tokens=[TOKENS[144 + k]])
        if k % 4 == 0:
            stage.decode([144 + k // 2, 145 + k // 2], [[2], [2]], tokens=[5, 6])
    stage.seq_rm(2)


def _chunk(stage: Stage, slot: int, seq: int = 0) -> np.ndarray:
    return stage.decode(list(range(128, 192)), [[seq]] * 64, tokens=TOKENS[128:192],
                        logit_rows=[False] * 63 + [True], slot=slot).copy()


def _after(stage: Stage) -> np.ndarray:
    return stage.decode(list(range(192, 208)), [[0]] * 16, tokens=TOKENS[192:208]).copy()


@pytest.mark.slow
def test_a_refill_context_computes_a_fresh_evaluations_bits():
    config = StageConfig(n_ctx=1024, n_batch=512, n_seq_max=8, refill_ctx=256)
    with Stage(qwen_small(), config) as stage:
        assert stage.n_slots == 1
        _prompt(stage, 128)
        fresh_chunk, fresh_after = _chunk(stage, 0), _after(stage)
        _generated(stage)
        stage.seed(0, 0, 128, slot=1)          # the refill context takes the exact prefix
        assert stage.seq_pos_max(0, slot=1) == 127
        assert np.array_equal(_chunk(stage, 1), fresh_chunk)
        stage.seed(0, 1, -1, slot=0)           # the slot takes the refilled cells back
        assert stage.seq_pos_max(0, slot=0) == 191 and stage.seq_pos_max(2, slot=0) == -1
        assert np.array_equal(_after(stage), fresh_after)
        _generated(stage)   # the same chunk in the slot's context, behind the decode cells
        stage.seq_cp(0, 1, 0, 128)
        behind = _chunk(stage, 0, seq=1)
    if np.array_equal(behind, fresh_chunk):
        pytest.skip("this host's kernels give a 64-token batch the same bits behind other "
                    "cells (the refill context is still what the server relies on)")
    assert not np.array_equal(behind, fresh_chunk)


def test_a_refill_context_is_small_and_refuses_what_does_not_fit(smollm2):
    config = StageConfig(n_ctx=512, n_batch=64, n_seq_max=4, n_slots=2, refill_ctx=128,
                         refill_batch=32)
    with Stage(smollm2, config) as stage:
        assert stage.n_slots == 2
        with pytest.raises(Exception, match="batch of 64 tokens"):
            stage.decode(list(range(64)), [[0]] * 64, tokens=TOKENS[:64], slot=3)
        stage.decode(list(range(32)), [[0]] * 32, tokens=TOKENS[:32], slot=3)
        assert stage.seq_pos_max(0, slot=3) == 31 and stage.seq_pos_max(0, slot=1) == -1


# --- served -------------------------------------------------------------------------------

def _server(tmp, strategy: str, model, chunk: int, split: str = "0,0.5,0.5") -> Server:
    return Server(tmp, 3, "-m", str(model), "-md", str(model), "--layer-split", split,
                  "-c", "1024", "--prefill-chunk", str(chunk), "--api-key", KEY,
                  "--parallel", "2", "--strategy", strategy, "--refill-along")


@pytest.fixture(scope="module", params=["iterative", "pipeinfer"])
def server(request, smollm2, tmp_path_factory):
    yield from serving(_server(tmp_path_factory.mktemp(f"along-{request.param}"),
                               request.param, smollm2, 16))


def conversation_at_once(server, answers: tuple[int, ...], chunk: int) -> None:
    """Each turn asked as soon as the answer before came (token-id prompts: a turn's prompt
    holds the previous answer's very tokens); then every turn again without the cache."""
    mark = len(server.stderr)
    prompt, turns = tokenize(server, CODE), []
    for n, ask in zip(answers, ASKS):
        body = complete(server, prompt, cache=True, n=n, timeout=300)
        turns.append((prompt, n, body))
        prompt = next_turn(server, prompt, body, ask)
    log = server.stderr[mark:]
    assert log.count("refilled along its generation") >= len(answers) - 1, log[-3000:]
    assert "refilling" not in log, log[-3000:]   # (nothing was left for an idle refill)
    for (prompt, n, body), (before, n_before, _) in zip(turns[1:], turns):
        reused = cached(body)
        assert reused == (len(before) + n_before) // chunk * chunk, (reused, len(before))
    for prompt, n, body in turns:
        fresh = complete(server, prompt, False, n, timeout=300)
        assert text_and_logprobs(body) == text_and_logprobs(fresh)


@pytest.mark.smollm2
def test_a_conversation_asked_at_once_reuses_its_answers(server):
    conversation_at_once(server, (60, 45, 30), 16)


@pytest.mark.slow
def test_a_conversation_asked_at_once_on_qwen_with_64_token_chunks(tmp_path):
    """The chunk size whose batches a slot's own context would compute otherwise (above)."""
    srv = _server(tmp_path, "pipeinfer", qwen_small(), 64)
    try:
        srv.wait_ready()
        conversation_at_once(srv, (150, 90), 64)
    finally:
        srv.kill()


@pytest.mark.smollm2
def test_a_head_holding_layers_refills_behind_its_loop_too(smollm2, tmp_path):
    """The head's own slice computes the refill's chunks behind its loop as the workers do
    (engine/head/pipeline.py): the answers are a fresh evaluation's all the same."""
    srv = _server(tmp_path, "pipeinfer", smollm2, 16, split="0.4,0.3,0.3")
    try:
        srv.wait_ready()
        conversation_at_once(srv, (60, 45), 16)
    finally:
        srv.kill()
