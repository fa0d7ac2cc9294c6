"""The exact prompt cache, for real: `pipeinfer serve --ranks 3` with the default
`--cache-prompt exact` and small prompt chunks (`--prefill-chunk 16`, so that short prompts
span several), asked over HTTP; SmolLM2 and Qwen2.5-Coder 1.5B (drafted by the 0.5B),
iterative and pipeinfer. A greedy request asked again, a third time and after others, and
every turn of a six-turn conversation, is answered as with `"cache_prompt": false`, down to
its first token's logprobs, and says how many prompt tokens it reused. The case where keeping
one cell past the last whole chunk changes the logits is built and checked both ways (on
Qwen, whose repacked weights are multiplied by row groups: a row's bits depend on the batch
it was in): llama-server's mode, which keeps that cell, changes them. A long conversation
reuses most of its history from its second turn on; a request resumed after a worker is
killed, with the cache on, is the undisturbed one."""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path

import httpx
import pytest

from pipeinfer.model.models import ModelError, resolve_model
from support.serving import AUTH, KEY, Server, serving

pytestmark = pytest.mark.smollm2

CHUNK = 16
N_CTX = 1024
CODE = ("def merge_sort(items):\n    if len(items) <= 1:\n        return items\n"
        "    middle = len(items) // 2\n    left = merge_sort(items[:middle])\n")


def qwen_pair() -> tuple[Path, Path]:
    try:
        return tuple(resolve_model(name, fetch_missing=False)
                     for name in ("qwen-coder-1.5b", "qwen-coder-0.5b"))
    except ModelError as err:
        pytest.skip(f"the Qwen models are not cached: {err}")


@pytest.fixture(scope="module", params=["smollm2", pytest.param("qwen", marks=pytest.mark.slow)])
def models(request, smollm2) -> tuple[Path, Path]:
    """(target, draft)."""
    return (smollm2, smollm2) if request.param == "smollm2" else qwen_pair()


def server_args(models, *extra: str) -> list[str]:
    target, draft = models
    return ["-m", str(target), "-md", str(draft), "--layer-split", "0,0.5,0.5",
            "-c", str(N_CTX), "--prefill-chunk", str(CHUNK), "--api-key", KEY,
            "--alias", "m", "--parallel", "2", *extra]


@pytest.fixture(scope="module", params=["iterative", "pipeinfer"])
def server(request, models, tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp(f"exact-{request.param}"), 3,
                 *server_args(models, "--strategy", request.param))
    yield from serving(srv)


def complete(server, prompt, cache: bool, n: int = 24, **fields) -> dict:
    r = httpx.post(server.url + "/v1/completions", headers=AUTH, timeout=180, json={
        "prompt": prompt, "max_tokens": n, "temperature": 0, "logprobs": 5,
        "cache_prompt": cache, **fields})
    assert r.status_code == 200, r.text
    return r.json()


def answer(body: dict) -> tuple[str, list]:
    """The text, and the first token's top logprobs: floats a last bit changes."""
    choice = body["choices"][0]
    return choice["text"], choice["logprobs"]["top_logprobs"][0]


def cached(body: dict) -> int:
    return body["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_the_same_request_again_is_the_same_answer(server):
    prompt = CODE + "    right = merge_sort(items[middle:])\n"
    fresh = complete(server, prompt, cache=False)
    n_prompt = fresh["usage"]["prompt_tokens"]
    for _ in range(3):
        again = complete(server, prompt, cache=True)
        assert answer(again) == answer(fresh)
        assert cached(again) == (n_prompt - 1) // CHUNK * CHUNK > 0
    complete(server, "The capital of France is", cache=True)   # others in between
    complete(server, CODE + "# a different ending of the same beginning\n", cache=True)
    assert answer(complete(server, prompt, cache=True)) == answer(fresh)


def test_a_six_turn_conversation_is_answered_as_without_the_cache(server):
    messages, reused = [{"role": "system", "content": "You answer in one short line."}], []
    for question in ("What is a list in Python?", "And a tuple?", "How do I sort a list?",
                     "Reverse it?", "What does len do?", "Thanks. Anything else?"):
        messages.append({"role": "user", "content": question})
        bodies = []
        for cache in (True, False):
            r = httpx.post(server.url + "/v1/chat/completions", headers=AUTH, timeout=180,
                           json={"messages": messages, "max_tokens": 20, "temperature": 0,
                                 "cache_prompt": cache, "logprobs": True, "top_logprobs": 3})
            assert r.status_code == 200, r.text
            bodies.append(r.json())
        with_cache, without = bodies
        content = [c["message"]["content"] for c in (with_cache["choices"][0],
                                                     without["choices"][0])]
        assert content[0] == content[1]
        assert with_cache["choices"][0]["logprobs"] == without["choices"][0]["logprobs"]
        reused.append(cached(with_cache))
        messages.append({"role": "assistant", "content": content[0]})
    assert all(n > 0 and n % CHUNK == 0 for n in reused[1:]), reused


def query_pair(server) -> tuple[list[int], list[int]]:
    """Q, then P, as token ids: Q's last prompt chunk holds one token (Q has 2 chunks and 1
    token), and P is Q and 17 more. A cut one cell past the chunk bound keeps that token's
    cell, computed as a batch of one row where a fresh evaluation of P computes it in a
    batch of CHUNK rows."""
    text = CODE + "    right = merge_sort(items[middle:])\n    return merge(left, right)\n"
    r = httpx.post(server.url + "/tokenize", headers=AUTH, json={"content": text}, timeout=30)
    ids = [t if isinstance(t, int) else t["id"] for t in r.json()["tokens"]]
    n_q = 2 * CHUNK + 1
    assert len(ids) >= n_q + 17
    return ids[:n_q], ids[:n_q + 17]


@pytest.fixture
def pair(server) -> tuple[list[int], list[int]]:
    return query_pair(server)


def first_logprobs_after(server, q: list[int], p: list[int]) -> tuple[list, list, int]:
    """P's first token's top logprobs fresh, and with Q's cells kept; P's reused tokens."""
    fresh = answer(complete(server, p, cache=False, n=1))[1]
    complete(server, q, cache=True, n=1)
    after = complete(server, p, cache=True, n=1)
    return fresh, answer(after)[1], cached(after)


def test_the_exact_cut_is_a_chunk_bound_and_changes_nothing(server, pair):
    q, p = pair
    fresh, after, n = first_logprobs_after(server, q, p)
    assert n == len(q) // CHUNK * CHUNK and after == fresh


@pytest.mark.slow
def test_keeping_one_cell_more_changes_the_logits(tmp_path):
    """The case above under llama-server's mode, which keeps all of Q: the one cell past the
    chunk bound makes P's logprobs differ from the fresh evaluation's, so the test above
    would fail if the exact cut kept a cell more."""
    srv = Server(tmp_path, 3, *server_args(qwen_pair(), "--cache-prompt", "llama-server"))
    try:
        srv.wait_ready()
        q, p = query_pair(srv)
        fresh, after, n = first_logprobs_after(srv, q, p)
        assert n == len(q) and after != fresh
    finally:
        srv.kill()


@pytest.mark.slow
def test_a_long_conversation_reuses_its_history(smollm2, tmp_path):
    """More than 1,100 prompt tokens with the default chunk size: from the second turn on,
    all the whole chunks of the history are reused, and the answers are the fresh ones."""
    srv = Server(tmp_path, 3, "-m", str(smollm2), "-c", "2048", "--api-key", KEY)
    history = open(__file__, encoding="utf-8").read()[:4200]
    messages = [{"role": "user", "content": "Here is a file:\n" + history}]
    try:
        srv.wait_ready()
        for turn, question in enumerate(("Summarise it.", "Name one test.", "Why chunks?")):
            messages.append({"role": "user", "content": question})
            bodies = [httpx.post(srv.url + "/v1/chat/completions", headers=AUTH, timeout=300,
                                 json={"messages": messages, "max_tokens": 16,
                                       "temperature": 0, "cache_prompt": cache}).json()
                      for cache in (True, False)]
            assert bodies[0]["usage"]["prompt_tokens"] > 1100
            assert bodies[0]["choices"][0]["message"] == bodies[1]["choices"][0]["message"]
            if turn:
                assert cached(bodies[0]) >= 1024, bodies[0]["usage"]
            messages.append(bodies[0]["choices"][0]["message"])
    finally:
        srv.kill()


def test_a_resumed_request_with_the_cache_is_the_undisturbed_one(smollm2, tmp_path):
    """A request that reused a kept prefix, streaming when a worker is killed: the front
    resumes it on a new job (whose slots keep nothing), and its text is the undisturbed
    one, token for token."""
    srv = Server(tmp_path, 3, *server_args((smollm2, smollm2), "--strategy", "pipeinfer"))
    prompt = CODE + "    right = merge_sort(items[middle:])\n"
    try:
        health = srv.wait_ready()
        undisturbed = complete(srv, prompt, cache=False, n=96, ignore_eos=True)
        complete(srv, CODE, cache=True, n=4)   # a slot keeps CODE's chunks
        chunks, done = [], threading.Event()

        def stream() -> None:
            with httpx.stream("POST", srv.url + "/v1/completions", headers=AUTH, timeout=300,
                              json={"prompt": prompt, "max_tokens": 96, "temperature": 0,
                                    "ignore_eos": True, "stream": True}) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        chunks.append(line)
            done.set()

        thread = threading.Thread(target=stream)
        thread.start()
        while len(chunks) < 16 and not done.is_set():
            done.wait(0.02)
        worker = next(r["pid"] for r in health["ranks"] if r["rank"] == 1)
        os.kill(worker, signal.SIGKILL)
        thread.join(300)
        text = "".join(json.loads(c[6:])["choices"][0]["text"] for c in chunks
                       if json.loads(c[6:])["choices"])
        assert text == undisturbed["choices"][0]["text"]
        assert srv.wait_ready(after_job=health["job"])["job"] > health["job"]
    finally:
        srv.kill()
