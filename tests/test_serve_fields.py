"""`pipeinfer serve` answering what tools send beyond a plain prompt, for real: a 3-rank job
(SmolLM2, itself as the draft, pipeinfer's strategy, so drafts are verified in runs of several
tokens), asked with the `openai` client and httpx. Logprobs equal llama.cpp's (llama-cpp-python's
own completion logprobs; per position from the raw logits for chat); greedy answers with
penalties and logit bias equal llama.cpp's sampler chain's; an answer cut inside a UTF-8
character holds the incomplete bytes back; /tokenize, /detokenize, the routes without /v1,
one model by id, CORS."""

from __future__ import annotations

import json
import threading

import httpx
import pytest

from pipeinfer.config.job import PREFILL_CHUNK
from support.llama_oracle import (Chain, KeptConversation, chain_greedy, completion_logprobs,
                                   llama_greedy)
from support.serve_oracle import N_CTX, assert_schema_answer_exact, chat_tokens, expected
from support.serving import AUTH, KEY, Server, metric, serving

pytestmark = [pytest.mark.slow, pytest.mark.smollm2]

REPEATING = "apple, pear, plum, apple, pear, plum, apple, pear,"


@pytest.fixture(scope="module")
def server(smollm2, tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp("serve-fields"), 3, "-m", str(smollm2), "-md",
                 str(smollm2), "--strategy", "pipeinfer", "--layer-split", "0,0.5,0.5",
                 "-c", str(N_CTX), "--api-key", KEY, "--alias", "smollm2", "--parallel", "2",
                 "--no-cache-prompt")   # answers compared with fresh evaluations; but one test
    yield from serving(srv)


def test_completion_logprobs_equal_llama_cpp_pythons(server, client, smollm2, tokenizer):
    prompt = "def fibonacci(n):\n"
    ids = tokenizer.tokenize(prompt)
    want = completion_logprobs(smollm2, ids, 16, 3, n_ctx=N_CTX)
    got = client.completions.create(model="smollm2", prompt=prompt, max_tokens=16,
                                    temperature=0, logprobs=3).choices[0]
    assert got.text == want["text"]
    assert got.logprobs.tokens == want["logprobs"]["tokens"]
    assert got.logprobs.token_logprobs == [float(x) for x in
                                           want["logprobs"]["token_logprobs"]]
    assert got.logprobs.top_logprobs == [{k: float(v) for k, v in top.items()}
                                         for top in want["logprobs"]["top_logprobs"]]
    start = want["logprobs"]["text_offset"][0]   # (its offsets count from its prompt text)
    assert got.logprobs.text_offset == [o - start for o in want["logprobs"]["text_offset"]]


def test_chat_logprobs_whole_and_streamed(server, client, smollm2, tokenizer):
    messages = [{"role": "user", "content": "Name three colours of the rainbow."}]
    whole = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=12,
                                           temperature=0, logprobs=True, top_logprobs=4)
    tokens, logprobs = chain_greedy(smollm2, chat_tokens(tokenizer, messages), 12,
                                    n_ctx=N_CTX, n_top=4)
    content = whole.choices[0].logprobs.content
    assert [bytes(c.bytes) for c in content] == [tokenizer.piece(t) for t in tokens]
    assert [c.logprob for c in content] == [lp for lp, _ in logprobs]
    for entry, (_, top) in zip(content, logprobs):
        assert [t.logprob for t in entry.top_logprobs] == list(top.values())
        assert [bytes(t.bytes) for t in entry.top_logprobs] == [tokenizer.piece(t)
                                                                 for t in top]
    stream = client.chat.completions.create(model="smollm2", messages=messages,
                                            max_tokens=12, temperature=0, logprobs=True,
                                            top_logprobs=4, stream=True)
    streamed = [c for chunk in stream if chunk.choices and chunk.choices[0].logprobs
                for c in chunk.choices[0].logprobs.content]
    assert [c.model_dump() for c in streamed] == [c.model_dump() for c in content]
    plain = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=4,
                                           temperature=0)
    assert plain.choices[0].logprobs is None


@pytest.mark.parametrize("chain", [
    Chain(repeat_penalty=1.5, repeat_last_n=16),
    Chain(frequency_penalty=0.8, presence_penalty=0.6),
    Chain(repeat_penalty=1.2, frequency_penalty=0.3, repeat_last_n=-1),
])
def test_penalties_are_llama_cpp_chains(server, smollm2, tokenizer, chain):
    ids = tokenizer.tokenize(REPEATING)
    plain, _ = chain_greedy(smollm2, ids, 24, n_ctx=N_CTX)
    want, _ = chain_greedy(smollm2, ids, 24, chain, n_ctx=N_CTX)
    assert want != plain   # (the penalties change this answer)
    body = {"prompt": REPEATING, "max_tokens": 24, "temperature": 0, "ignore_eos": True,
            "repeat_penalty": chain.repeat_penalty, "repeat_last_n": chain.repeat_last_n,
            "frequency_penalty": chain.frequency_penalty,
            "presence_penalty": chain.presence_penalty}
    r = httpx.post(server.url + "/v1/completions", headers=AUTH, json=body, timeout=120)
    assert r.json()["choices"][0]["text"] == tokenizer.detokenize(want)


def test_logit_bias_bans_and_forces(server, client, smollm2, tokenizer):
    prompt = "The capital of France is"
    ids = tokenizer.tokenize(prompt)
    plain, _ = chain_greedy(smollm2, ids, 10, n_ctx=N_CTX)
    ban = Chain(logit_bias=((plain[0], -100.0), (plain[1], -100.0)))
    want, _ = chain_greedy(smollm2, ids, 10, ban, n_ctx=N_CTX)
    got = client.completions.create(
        model="smollm2", prompt=prompt, max_tokens=10, temperature=0,
        logit_bias={str(t): b for t, b in ban.logit_bias}).choices[0].text
    assert got == tokenizer.detokenize(want) and plain[0] not in tokenizer.tokenize(
        got, add_special=False)[:1]
    forced = tokenizer.tokenize(" Paris", add_special=False)[0]
    got = client.completions.create(model="smollm2", prompt=prompt, max_tokens=3,
                                    temperature=0, logit_bias={str(forced): 100})
    assert got.choices[0].text == tokenizer.detokenize([forced] * 3)


def test_min_p_keeps_greedy(server, client):
    ask = dict(model="smollm2", prompt="1, 2, 3,", max_tokens=8, temperature=0)
    plain = client.completions.create(**ask).choices[0].text
    assert client.completions.create(**ask, extra_body={"min_p": 0.5}).choices[0].text == plain


def test_cut_inside_a_character_holds_its_bytes_back(server, tokenizer):
    """max_tokens ends the answer after a token holding the first bytes of a character
    (forced with logit_bias): no U+FFFD, streamed or whole, as llama-server."""
    lead = next(t for t in range(tokenizer.n_vocab) if tokenizer.piece(t) == b" \xe2")
    body = {"prompt": "Coffee:", "max_tokens": 1, "temperature": 0,
            "logit_bias": {str(lead): 100}}
    r = httpx.post(server.url + "/v1/completions", headers=AUTH, json=body, timeout=60)
    choice = r.json()["choices"][0]
    assert (choice["text"], choice["finish_reason"]) == (" ", "length")
    with httpx.stream("POST", server.url + "/v1/completions", headers=AUTH,
                      json=dict(body, stream=True), timeout=60) as r:
        lines = [line for line in r.iter_lines() if line]
    text = "".join(json.loads(line[6:])["choices"][0]["text"] for line in lines[:-1]
                   if json.loads(line[6:])["choices"])
    assert text == " " and "\ufffd" not in text


def test_tokenize_and_detokenize(server, tokenizer):
    text = "café ☕ <|im_start|>"
    r = httpx.post(server.url + "/tokenize", headers=AUTH,
                   json={"content": text, "with_pieces": True})
    pieces = r.json()["tokens"]
    ids = [p["id"] for p in pieces]
    assert ids == tokenizer.tokenize(text, add_special=False)
    assert pieces[-1]["piece"] == "<|im_start|>"       # a special token, parsed
    assert any(isinstance(p["piece"], list) for p in pieces)   # a character's first bytes
    plain = httpx.post(server.url + "/tokenize", headers=AUTH, json={"content": text}).json()
    assert plain == {"tokens": ids}
    r = httpx.post(server.url + "/detokenize", headers=AUTH, json={"tokens": ids})
    assert r.json() == {"content": text}
    r = httpx.post(server.url + "/detokenize", headers=AUTH, json={"tokens": [10 ** 9]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tokens"


def test_routes_without_v1_models_by_id_and_cors(server):
    url = server.url
    r = httpx.post(url + "/completions", headers=AUTH,
                   json={"prompt": "1, 2, 3,", "max_tokens": 3, "temperature": 0})
    assert r.status_code == 200 and r.json()["object"] == "text_completion"
    r = httpx.post(url + "/chat/completions", headers=AUTH, json={
        "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3})
    assert r.status_code == 200 and r.json()["object"] == "chat.completion"
    assert httpx.get(url + "/models", headers=AUTH).json()["data"][0]["id"] == "smollm2"
    assert httpx.get(url + "/v1/health").json()["status"] == "ok"   # no key needed
    assert httpx.get(url + "/v1/models/smollm2", headers=AUTH).json()["id"] == "smollm2"
    r = httpx.get(url + "/v1/models/gpt-4", headers=AUTH)
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    preflight = httpx.options(url + "/v1/chat/completions", headers={
        "Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert preflight.status_code == 200   # answered without the key
    assert preflight.headers["access-control-allow-origin"] in ("*", "http://localhost:3000")
    r = httpx.get(url + "/v1/models", headers={**AUTH, "Origin": "http://localhost:3000"})
    assert r.headers["access-control-allow-origin"] == "*"
    r = httpx.get(url + "/v1/chat/completions", headers=AUTH)
    assert r.status_code == 405 and r.json()["error"]["type"] == "invalid_request_error"
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    r = httpx.post(url + "/v1/chat/completions", headers=AUTH, json={
        "messages": [{"role": "user", "content": "Hi"}], "tools": tools, "max_tokens": 24})
    assert r.status_code == 200   # (no tool template: the generic format, as llama-server's)
    assert r.json()["choices"][0]["finish_reason"] in ("tool_calls", "stop", "length")


def test_two_choices_and_two_prompts_are_each_exact(server, client, smollm2, tokenizer):
    """n = 2 (greedy: the same answer twice) and an array of two prompts (one choice each),
    generated side by side in the server's two slots, streamed and whole."""
    messages = [{"role": "user", "content": "Write a haiku about pipelines."}]
    want = expected(smollm2, tokenizer, chat_tokens(tokenizer, messages), 20)
    answer = client.chat.completions.create(model="smollm2", messages=messages, n=2,
                                            max_tokens=20, temperature=0)
    assert [c.message.content for c in answer.choices] == [want[0]] * 2
    assert answer.usage.completion_tokens == 2 * want[1]
    assert answer.usage.prompt_tokens == len(chat_tokens(tokenizer, messages))
    prompts = ["The capital of France is", "import numpy as np\n"]
    wants = [expected(smollm2, tokenizer, tokenizer.tokenize(p), 16)[0] for p in prompts]
    stream = client.completions.create(model="smollm2", prompt=prompts, max_tokens=16,
                                       temperature=0, stream=True)
    texts = ["", ""]
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.text
    assert texts == wants
    r = httpx.post(server.url + "/v1/completions", headers=AUTH,
                   json={"prompt": prompts, "n": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"   # 4 > --parallel 2


def test_logprobs_and_penalties_exact_with_another_request_in_flight(server, smollm2,
                                                                      tokenizer):
    """Two requests at once in the two slots: each one's logprobs and penalized tokens are
    its own, exact as alone."""

    chain = Chain(repeat_penalty=1.4, presence_penalty=0.5, repeat_last_n=32)
    ids = tokenizer.tokenize(REPEATING)
    want_pen, _ = chain_greedy(smollm2, ids, 24, chain, n_ctx=N_CTX)
    prompt = "import numpy as np\n"
    want_tokens, want_lp = chain_greedy(smollm2, tokenizer.tokenize(prompt), 20,
                                        n_ctx=N_CTX, n_top=2)
    answers = {}

    def penalized():
        body = {"prompt": REPEATING, "max_tokens": 24, "temperature": 0, "ignore_eos": True,
                "repeat_penalty": 1.4, "presence_penalty": 0.5, "repeat_last_n": 32,
                "stream": True}
        with httpx.stream("POST", server.url + "/v1/completions", headers=AUTH, json=body,
                          timeout=120) as r:
            answers["pen"] = "".join(json.loads(line[6:])["choices"][0]["text"]
                                     for line in r.iter_lines()
                                     if line and line != "data: [DONE]"
                                     and json.loads(line[6:])["choices"])

    def with_logprobs():
        body = {"prompt": prompt, "max_tokens": 20, "temperature": 0, "logprobs": 2,
                "ignore_eos": True}
        answers["lp"] = httpx.post(server.url + "/v1/completions", headers=AUTH, json=body,
                                   timeout=120).json()["choices"][0]["logprobs"]

    threads = [threading.Thread(target=f) for f in (penalized, with_logprobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert answers["pen"] == tokenizer.detokenize(want_pen)
    assert "(2 under way)" in server.stderr   # (they overlapped)
    assert answers["lp"]["token_logprobs"] == [lp for lp, _ in want_lp]
    assert [sorted(top.values()) for top in answers["lp"]["top_logprobs"]] == [
        sorted({*top.values(), lp}) for lp, top in want_lp]


PASTE = ("Here is my module:\n```python\n" + "\n".join(
    f"def step_{i}(x):\n    return x * {i} + {i % 7}\n" for i in range(12)) + "```\n")


def eos_cut(tokenizer, tokens) -> str:
    end = next((i + 1 for i, t in enumerate(tokens) if tokenizer.is_eog(t)), len(tokens))
    return tokenizer.detokenize(tokens[:end])


def exact_reuse(kept: list[int], exact: int, prompt: list[int]) -> int:
    """What the exact cache reuses of `kept` (whose first `exact` cells are a fresh
    evaluation's) for `prompt`: the common prefix cut to a whole prompt chunk."""
    shared = next((i for i, (a, b) in enumerate(zip(kept, prompt)) if a != b),
                  min(len(kept), len(prompt)))
    return min(shared, exact, len(prompt) - 1) // PREFILL_CHUNK * PREFILL_CHUNK


def test_a_conversation_reuses_whole_chunks_of_its_earlier_turns(server, client, smollm2,
                                                                  tokenizer):
    """cache_prompt (exact, as the server has the cache off and the requests ask for it):
    each turn of a conversation goes to the slot that kept the previous turn, reuses the
    whole prompt chunks of its history (not the answer's cells, which decode runs computed)
    and its answer is a fresh evaluation's, also with another request in flight. A request
    without cache_prompt reuses nothing."""
    questions = [PASTE + "What does step_3 return for 2?", "And step_5 for 1?",
                 "Which step multiplies by 11?"]
    messages, total, other, kept = [], 0, None, ([], 0)
    try:
        for turn, question in enumerate(questions):
            messages.append({"role": "user", "content": question})
            prompt = chat_tokens(tokenizer, messages)
            want = eos_cut(tokenizer, llama_greedy(smollm2, prompt, 40, n_ctx=N_CTX))
            cached = exact_reuse(*kept, prompt)
            if turn == 1:    # another request in flight, in the other slot
                other = threading.Thread(target=httpx.post, args=(
                    server.url + "/v1/completions",), kwargs={
                        "headers": AUTH, "timeout": 120, "json": {
                            "prompt": REPEATING, "max_tokens": 60, "ignore_eos": True}})
                other.start()
            got = client.chat.completions.create(
                model="smollm2", messages=messages, max_tokens=40, temperature=0,
                extra_body={"cache_prompt": True})
            assert got.usage.prompt_tokens == len(prompt) > PREFILL_CHUNK
            assert got.usage.prompt_tokens_details.cached_tokens == cached
            assert got.choices[0].message.content == want
            if turn:
                assert cached >= PREFILL_CHUNK
            total += cached
            kept = (prompt, len(prompt) // PREFILL_CHUNK * PREFILL_CHUNK)
            messages.append({"role": "assistant", "content": want})
    finally:
        if other is not None:
            other.join(120)
    again = client.chat.completions.create(model="smollm2", messages=messages[:-1],
                                           max_tokens=40, temperature=0,
                                           extra_body={"cache_prompt": False})
    assert again.usage.prompt_tokens_details.cached_tokens == 0
    assert again.choices[0].message.content == messages[-1]["content"]
    metrics = httpx.get(server.url + "/metrics", headers=AUTH).text
    assert f"pipeinfer_prompt_tokens_cached_total {float(total)}" in metrics


def test_llama_servers_cache_keeps_the_answers_cells_too(smollm2, tokenizer, tmp_path):
    """--cache-prompt llama-server: a turn reuses the whole common prefix, the previous
    answer's cells included, and its answer is llama.cpp's when llama.cpp, too, keeps what
    it evaluated and evaluates the rest in the same batches (KeptConversation)."""
    srv = Server(tmp_path, 3, "-m", str(smollm2), "--layer-split", "0,0.5,0.5", "-c",
                 str(N_CTX), "--api-key", KEY, "--cache-prompt", "llama-server")
    oracle = KeptConversation(smollm2, n_ctx=N_CTX)
    messages, previous = [], []
    try:
        srv.wait_ready()
        for turn, question in enumerate(["Write a Python function that adds two numbers.",
                                         "Now make it subtract them."]):
            messages.append({"role": "user", "content": question})
            prompt = chat_tokens(tokenizer, messages)
            want, cached = oracle.answer(prompt, 40, tokenizer.is_eog)
            r = httpx.post(srv.url + "/v1/chat/completions", headers=AUTH, timeout=180,
                           json={"messages": messages, "max_tokens": 40, "temperature": 0})
            body = r.json()
            assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == cached
            assert body["choices"][0]["message"]["content"] == eos_cut(tokenizer, want)
            if turn:   # the previous answer's cells were kept too, not only its prompt's
                assert cached > len(previous) + 5, (cached, len(previous))
            previous = prompt
            messages.append({"role": "assistant",
                             "content": body["choices"][0]["message"]["content"]})
    finally:
        oracle.close()
        srv.kill()


def test_forced_tokens_are_free_drafts_and_the_answer_stays_exact(server, client, smollm2,
                                                                  tokenizer):
    """Under a JSON schema the text the grammar forces (braces, quotes, keys) is drafted
    without the draft model (counted in /metrics), and the answer is still llama.cpp's with
    its grammar sampler, one token per decode."""
    schema = {"type": "object", "properties": {"people": {
        "type": "array", "minItems": 2, "maxItems": 2, "items": {
            "type": "object", "properties": {"name": {"type": "string"},
                                             "age": {"type": "integer"}},
            "required": ["name", "age"]}}}, "required": ["people"]}
    ask = [{"role": "user", "content": "Invent two people with a name and an age."}]
    free = metric(server, "pipeinfer_drafted_free_tokens_total")
    assert_schema_answer_exact(client, smollm2, tokenizer, ask, schema, 60)
    assert metric(server, "pipeinfer_drafted_free_tokens_total") > free


class Person(__import__("pydantic").BaseModel):
    name: str
    age: int


def test_structured_output_follows_the_grammar_exactly(server, client, smollm2, tokenizer):
    """response_format json_object / json_schema (the openai SDK's parse() with a pydantic
    model) and a GBNF grammar: the answer keeps to the grammar, and is llama.cpp's with its
    grammar sampler (greedy, exact under speculation)."""
    from llama_cpp.llama_grammar import JSON_GBNF, json_schema_to_gbnf

    def oracle(messages, gbnf, n):
        tokens, _ = chain_greedy(smollm2, chat_tokens(tokenizer, messages), n,
                                 Chain(grammar=gbnf), n_ctx=N_CTX)
        end = next((i for i, t in enumerate(tokens) if tokenizer.is_eog(t)), len(tokens))
        return tokenizer.detokenize(tokens[:end])

    ask = [{"role": "user", "content": "Give a JSON object describing a cat."}]
    got = client.chat.completions.create(model="smollm2", messages=ask, max_tokens=60,
                                         temperature=0,
                                         response_format={"type": "json_object"})
    assert got.choices[0].message.content == oracle(ask, JSON_GBNF, 60)
    person = [{"role": "user", "content": "Invent a person: a name and an age."}]
    parsed = client.chat.completions.parse(model="smollm2", messages=person, max_tokens=60,
                                           temperature=0, response_format=Person)
    assert isinstance(parsed.choices[0].message.parsed, Person)
    schema = json_schema_to_gbnf(json.dumps(Person.model_json_schema()))
    assert parsed.choices[0].message.content == oracle(person, schema, 60)
    yes_no = 'root ::= ("yes" | "no") "."'
    r = httpx.post(server.url + "/v1/chat/completions", headers=AUTH, json={
        "messages": [{"role": "user", "content": "Is the sky blue?"}], "max_tokens": 8,
        "temperature": 0, "grammar": yes_no})
    choice = r.json()["choices"][0]
    assert choice["message"]["content"] in ("yes.", "no.")
    assert choice["finish_reason"] == "stop"   # the grammar ended: only the end was left
    r = httpx.post(server.url + "/v1/chat/completions", headers=AUTH, json={
        "messages": ask, "grammar": "root ::= ("})
    assert r.status_code == 400 and r.json()["error"]["param"] == "grammar"
