"""Structured output on a server with no draft model (`--draft-source ngram`, a 3-rank SmolLM2
job, pipeinfer's strategy): the n-gram lookups keep to the request's grammar
(engine/drafting/grammar_drafts.py GrammarTrack), the text the grammar forces is drafted for free, and
the answer is still llama.cpp's with its grammar sampler, one token per decode."""

from __future__ import annotations

import pytest

from support.serve_oracle import N_CTX, assert_schema_answer_exact
from support.serving import KEY, Server, metric, openai_client, serving

pytestmark = [pytest.mark.slow, pytest.mark.smollm2]

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


def test_lookups_draft_the_forced_text_and_the_answer_stays_exact(server, smollm2, tokenizer):
    ask = [{"role": "user", "content": "Invent three people with a name and an age."}]
    free = metric(server, "pipeinfer_drafted_free_tokens_total")
    assert_schema_answer_exact(openai_client(server), smollm2, tokenizer, ask, SCHEMA, 80)
    assert metric(server, "pipeinfer_drafted_free_tokens_total") > free
