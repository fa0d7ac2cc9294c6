"""`POST /v1/embeddings` served for real: a 3-rank job of SmolLM2 (its GGUF has no pooling
type: the mean), asked with the `openai` client and httpx. The last stage returns each
token's final hidden state, the head pools and normalizes them (engine/head/embedding_job.py).

Exactness against llama-cpp-python's `Llama(embedding=True)` on one node: the tokens' states
are bit-identical (an input of up to 64 tokens is one decode, as llama-cpp-python evaluates
it), so the vector equals the mean of llama-cpp-python's per-token embeddings, normalized,
bit for bit. llama.cpp's own mean pooling (pooling_type MEAN) sums inside its graph in
another order: within 1e-6 of it. A longer input is evaluated in runs of 64 tokens (the last
stage's output rows per decode): bit for bit llama.cpp's states in the same runs, and within
1e-3 of llama-cpp-python's one batch."""

from __future__ import annotations

import threading

import httpx
import numpy as np
import openai
import pytest

from pipeinfer.engine.head.embedding_job import MEAN, pool
from pipeinfer.model import models
from support.llama_oracle import chunked_states, token_states
from support.serve_oracle import N_CTX, chat_tokens, expected
from support.serving import AUTH, KEY, Server, openai_client, serving

pytestmark = [pytest.mark.slow, pytest.mark.smollm2]

TEXTS = ["The quick brown fox jumps over the lazy dog.",
         "Pipelined speculation keeps every stage busy."]
LONG = " ".join(f"Line {i}: the pipeline passes activations to the next rank." for i in
                range(12))


@pytest.fixture(scope="module")
def server(smollm2, tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp("serve-embeddings"), 3, "-m", str(smollm2),
                 "--layer-split", "0,0.5,0.5", "-c", str(N_CTX), "--api-key", KEY,
                 "--alias", "smollm2", "--parallel", "2")
    yield from serving(srv)


def test_vectors_are_llama_cpp_pythons_states_pooled(server, client, smollm2, tokenizer):
    import llama_cpp

    got = client.embeddings.create(model="smollm2", input=TEXTS)   # (base64, decoded)
    assert [d.index for d in got.data] == [0, 1] and got.model == "smollm2"
    n_tokens = 0
    for text, item in zip(TEXTS, got.data):
        states, tokens = token_states(smollm2, text, n_ctx=N_CTX)
        assert tokenizer.tokenize(text) == tokens and len(tokens) <= 64
        n_tokens += len(tokens)
        vector = np.array(item.embedding, dtype=np.float32)
        assert np.array_equal(vector, pool(states, MEAN))        # bit for bit
        llama_mean, _ = token_states(smollm2, text, llama_cpp.LLAMA_POOLING_TYPE_MEAN,
                                     n_ctx=N_CTX)
        assert np.abs(vector - llama_mean).max() < 1e-6
        assert abs(float(np.linalg.norm(vector)) - 1.0) < 1e-6
    assert got.usage.prompt_tokens == got.usage.total_tokens == n_tokens
    floats = httpx.post(server.url + "/v1/embeddings", headers=AUTH, json={
        "input": TEXTS[0], "encoding_format": "float"}).json()
    assert floats["object"] == "list" and floats["data"][0]["object"] == "embedding"
    assert floats["data"][0]["embedding"] == [float(x) for x in
                                              np.array(got.data[0].embedding, np.float32)]
    by_tokens = client.embeddings.create(model="smollm2", input=[tokenizer.tokenize(TEXTS[1])])
    assert by_tokens.data[0].embedding == got.data[1].embedding


def test_a_long_input_goes_in_runs_of_64_tokens(server, client, smollm2, tokenizer):
    """Its vector equals llama.cpp's states evaluated in the same runs (bit for bit); one
    batch of the whole input, as llama-cpp-python's embed() evaluates it, gives states that
    differ past the first 64 tokens (llama.cpp's attention over cached cells sums in another
    order than within one batch): close, not equal."""
    import llama_cpp

    tokens = tokenizer.tokenize(LONG)
    assert 64 < len(tokens) <= N_CTX
    got = np.array(client.embeddings.create(model="smollm2", input=LONG).data[0].embedding,
                   dtype=np.float32)
    assert np.array_equal(got, pool(chunked_states(smollm2, tokens, 64, n_ctx=N_CTX), MEAN))
    llama_mean, _ = token_states(smollm2, LONG, llama_cpp.LLAMA_POOLING_TYPE_MEAN,
                                 n_ctx=N_CTX)
    assert np.abs(got - llama_mean).max() < 1e-3


def test_embeddings_beside_a_completion_leave_it_exact(server, client, smollm2, tokenizer):
    """An embedding request while a chat is generated in the other slot: the chat's greedy
    answer is still llama.cpp's, the vector the same as alone."""
    messages = [{"role": "user", "content": "Tell me about the sea."}]
    want, _, _ = expected(smollm2, tokenizer, chat_tokens(tokenizer, messages), 40)
    answers = {}

    def chat():
        answers["chat"] = client.chat.completions.create(
            model="smollm2", messages=messages, max_tokens=40, temperature=0)

    thread = threading.Thread(target=chat)
    thread.start()
    alone = client.embeddings.create(model="smollm2", input=TEXTS[0]).data[0].embedding
    again = [client.embeddings.create(model="smollm2", input=TEXTS[0]).data[0].embedding
             for _ in range(2)]
    thread.join()
    assert answers["chat"].choices[0].message.content == want
    assert again == [alone, alone]


def test_bad_embedding_requests_are_400s_naming_the_field(server, client):
    cases = [("input", {"input": ""}), ("input", {"input": []}), ("input", {"input": [3.5]}),
             ("input", {"input": [[1, 2], ""]}), ("input", {}),
             ("input", {"input": [10 ** 9]}),
             ("input", {"input": "word " * (N_CTX + 8)}),
             ("encoding_format", {"input": "x", "encoding_format": "int8"}),
             ("dimensions", {"input": "x", "dimensions": 64})]
    for param, body in cases:
        r = httpx.post(server.url + "/v1/embeddings", headers=AUTH, json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, body
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="other", input="x")
    assert httpx.post(server.url + "/embeddings", headers=AUTH,
                      json={"input": "x"}).status_code == 200


@pytest.fixture(scope="module")
def qwen_server(tmp_path_factory):
    try:
        qwen = models.resolve_model("qwen-coder-0.5b", fetch_missing=False)
    except models.ModelError as err:
        pytest.skip(f"Qwen2.5-Coder 0.5B is not cached: {err}")
    srv = Server(tmp_path_factory.mktemp("serve-embeddings-qwen"), 3, "-m", str(qwen),
                 "--layer-split", "0,0.5,0.5", "-c", str(N_CTX), "--api-key", KEY,
                 "--alias", "qwen", "--parallel", "1")
    for ready in serving(srv, 240):
        yield ready, qwen


def test_qwen_vectors_too(qwen_server):
    """Another architecture, a 151,936-token vocabulary (the last stage's logits are
    computed beside the states): the same exactness."""
    srv, qwen = qwen_server
    client = openai_client(srv, 240)
    got = client.embeddings.create(model="qwen", input=TEXTS[0]).data[0].embedding
    states, _ = token_states(qwen, TEXTS[0], n_ctx=N_CTX)
    assert np.array_equal(np.array(got, dtype=np.float32), pool(states, MEAN))
