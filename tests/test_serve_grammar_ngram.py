"""Structured output on a server with no draft model (`--draft-source ngram`, a 3-rank SmolLM2
job, pipeinfer's strategy): the n-gram lookups keep to the request's grammar
(engine/grammar_drafts.py GrammarTrack), the text the grammar forces is drafted for free, and
the answer is still llama.cpp's with its grammar sampler, one token per decode."""

from __future__ import annotations

import json

import httpx
import pytest

from llama_oracle import Chain, chain_greedy
from test_serve import AUTH, KEY, N_CTX, Server, chat_tokens, open_tokenizer, openai_client, \
    serving

pytestmark = pytest.mark.smollm2

SCHEMA = {"type": "object", "properties": {"people": {
    "type": "array", "minItems": 3, "maxItems": 3, "items": {
        "type": "object", "properties": {"name": {"type": "string"},
                                         "age": {"type": "integer"}},
        "required": ["name", "age"]}}}, "required": ["people"]}


@pytest.fixture(scope="module")
def server(smollm2, tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp("serve-grammar-ngram"), 3, "-m", str(smollm2),
                 "--strategy", "pipeinfer", "--draft-source", "ngram", "--layer-split",
                 "0,0.5,0.5", "-c", str(N_CTX), "--api-key", KEY, "--alias", "smollm2",
                 "--no-cache-prompt")
    yield from serving(srv)


@pytest.fixture(scope="module")
def tokenizer(smollm2):
    yield from open_tokenizer(smollm2)


def metric(server, name: str) -> float:
    text = httpx.get(server.url + "/metrics", headers=AUTH).text
    return float(next(line.split()[1] for line in text.splitlines()
                      if line.startswith(name + " ")))


def test_lookups_draft_the_forced_text_and_the_answer_stays_exact(server, smollm2, tokenizer):
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    ask = [{"role": "user", "content": "Invent three people with a name and an age."}]
    free = metric(server, "pipeinfer_drafted_free_tokens_total")
    got = openai_client(server).chat.completions.create(
        model="smollm2", messages=ask, max_tokens=80, temperature=0,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "people", "schema": SCHEMA}})
    tokens, _ = chain_greedy(smollm2, chat_tokens(tokenizer, ask), 80,
                             Chain(grammar=json_schema_to_gbnf(json.dumps(SCHEMA))),
                             n_ctx=N_CTX)
    end = next((i for i, t in enumerate(tokens) if tokenizer.is_eog(t)), len(tokens))
    assert got.choices[0].message.content == tokenizer.detokenize(tokens[:end])
    assert metric(server, "pipeinfer_drafted_free_tokens_total") > free
