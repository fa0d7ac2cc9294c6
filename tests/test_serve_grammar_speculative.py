"""Structured output under the speculative strategy on the plain weight layout (runs of up
to 7 tokens stay exact there): the text a grammar forces costs no draft step, so it fills a
run up to the run's limit, past --draft (DraftJob.room), and the answer is still llama.cpp's
with its grammar sampler, one token per decode, on the same layout."""

from __future__ import annotations

import re

import pytest

from support.serve_oracle import N_CTX, assert_schema_answer_exact
from support.serving import KEY, Server, metric, openai_client, serving

pytestmark = [pytest.mark.slow, pytest.mark.smollm2]

SCHEMA = {"type": "object", "properties": {"people": {
    "type": "array", "minItems": 3, "maxItems": 3, "items": {
        "type": "object", "properties": {"first_name": {"type": "string"},
                                         "age_in_years": {"type": "integer"}},
        "required": ["first_name", "age_in_years"]}}}, "required": ["people"]}


@pytest.fixture(scope="module")
def server(smollm2, tmp_path_factory):
    # the target as its own draft: the model's guesses are right, so what bounds a run is
    # the job's size (--draft 1 for the model's steps) and the run's limit
    srv = Server(tmp_path_factory.mktemp("serve-grammar-speculative"), 3, "-m", str(smollm2),
                 "-md", str(smollm2), "--strategy", "speculative", "--no-repack",
                 "--draft", "1", "--layer-split", "0,0.5,0.5", "-c", str(N_CTX),
                 "--api-key", KEY, "--alias", "smollm2", "--no-cache-prompt",
                 "-v")   # -v: the head logs every run it starts, with its size
    yield from serving(srv)


def test_forced_text_fills_runs_past_the_draft_limit_and_stays_exact(server, smollm2,
                                                                      tokenizer):
    ask = [{"role": "user", "content": "Invent three people with a first name and an age."}]
    free = metric(server, "pipeinfer_drafted_free_tokens_total")
    assert_schema_answer_exact(openai_client(server), smollm2, tokenizer, ask, SCHEMA, 100,
                               repack=False)
    assert metric(server, "pipeinfer_drafted_free_tokens_total") > free
    sizes = [int(n) for n in re.findall(r"StartRun\(run=\d+ spec pos \d+\.\.\d+ n=(\d+)\)",
                                         server.stderr)]
    # a speculative run: the pending token, one token of the model's (--draft 1), and the
    # forced text after it, up to the plain layout's 7
    assert sizes and max(sizes) > 2 and max(sizes) <= 7
