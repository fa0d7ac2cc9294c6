"""A prompt's tokens after its last whole chunk go in as runs of --prefill-tail tokens, which
pass the stages one behind the other (schedule/speculation.prompt_runs): the batches are a
function of the prompt's span and the job's flags, `simulate` models them, and the answer is
llama.cpp's evaluating the same batches. On Qwen's repacked weights a row's bits depend on
its batch, so a served first token's logprobs show which batches the stages evaluated."""

from __future__ import annotations

import httpx
import pytest

from pipeinfer.schedule.speculation import prompt_runs
from pipeinfer.plan.simulate import SimConfig, simulate
from support.cached_models import cached_models
from support.llama_oracle import chain_greedy
from support.serving import AUTH, KEY, Server, serving
from test_plan_prefill import MODEL, pipe


def sizes(start: int, stop: int, chunk: int = 64, tail: int = 16) -> list[int]:
    return [len(r) for r in prompt_runs(range(start, stop), chunk, tail)]


def test_whole_chunks_first_then_the_rest_in_tail_runs():
    assert sizes(0, 100) == [64, 16, 16, 4]
    assert sizes(0, 128) == [64, 64]          # nothing left over: chunks only
    assert sizes(0, 10) == [10]
    assert sizes(64, 100) == [16, 16, 4]      # the rest of a prompt whose prefix is kept
    assert sizes(0, 100, tail=0) == [64, 36]  # 0: the rest as one batch
    assert sizes(0, 100, tail=100) == [64, 36]
    runs = prompt_runs(range(5, 300), 64, 16)
    assert [p for r in runs for p in r] == list(range(5, 300))


def ttft(prompt_len: int, tail: int) -> float:
    counts = [0] + [MODEL.n_layer // 3] * 3
    return simulate(pipe(), counts, SimConfig("iterative", n_predict=8, prompt_len=prompt_len,
                                              prefill_tail=tail, idle_sleep=False)).ttft_s


def test_simulated_tail_runs_shorten_a_short_prompts_first_token():
    # 48 tokens on 3 equal stages: one batch passes them in turn (3 steps of 48 tokens);
    # three runs of 16 take 3 + 2 steps of 16
    assert ttft(48, 16) < 0.75 * ttft(48, 0)
    assert ttft(128, 16) == ttft(128, 0)      # no partial chunk: the same batches


N_PROMPT = 64 + 29   # a whole chunk, and a tail of 29: 8 + 8 + 8 + 5 under --prefill-tail 8
TEXT = ("def merge_sort(items):\n    if len(items) <= 1:\n        return items\n"
        "    middle = len(items) // 2\n    left = merge_sort(items[:middle])\n"
        "    right = merge_sort(items[middle:])\n    return merge(left, right)\n\n\n"
        "def merge(left, right):\n    out = []\n    while left and right:\n"
        "        out.append(left.pop(0) if left[0] <= right[0] else right.pop(0))\n"
        "    return out + left + right\n")


@pytest.fixture(scope="module")
def target():
    return cached_models("qwen-coder-0.5b")[0]


@pytest.fixture(scope="module")
def server(target, tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp("tail"), 3, "-m", str(target), "--strategy",
                 "iterative", "--layer-split", "0,0.5,0.5", "-c", "512", "--prefill-tail", "8",
                 "--api-key", KEY, "--alias", "m")
    yield from serving(srv)


@pytest.mark.slow
def test_the_answer_is_llama_cpps_with_the_same_tail_runs(server, target):
    r = httpx.post(server.url + "/tokenize", headers=AUTH, json={"content": TEXT}, timeout=30)
    ids = [t if isinstance(t, int) else t["id"] for t in r.json()["tokens"]][:N_PROMPT]
    assert len(ids) == N_PROMPT
    r = httpx.post(server.url + "/v1/completions", headers=AUTH, timeout=180, json={
        "prompt": ids, "max_tokens": 8, "temperature": 0, "logprobs": 5,
        "cache_prompt": False})
    assert r.status_code == 200, r.text
    got = r.json()["choices"][0]["logprobs"]
    same_runs = chain_greedy(target, ids, 8, n_top=5, tail=8)[1]
    assert got["token_logprobs"] == [lp for lp, _ in same_runs]
    assert [sorted(t.values()) for t in got["top_logprobs"]] == \
        [sorted(top.values()) for _, top in same_runs]
    # the tail as one batch computes other bits on hosts whose kernels take rows in groups
    # (this check is what makes the one above tell the batches apart)
    one_batch = chain_greedy(target, ids, 8, n_top=5, tail=0)[1]
    if one_batch == same_runs:
        pytest.skip("this host's kernels give the tail's rows the same bits in any batch")
    assert got["token_logprobs"] != [lp for lp, _ in one_batch]
