"""tool_choice "auto" under its lazy grammar, served for real: a 3-rank job of the Qwen pair
(Qwen2.5-Coder 1.5B, its 0.5B as the draft) with pipeinfer's strategy (drafts verified in
runs, drafts cut to the grammar and its forced text drafted for free once it is triggered)
and with the iterative one. Every answer is llama.cpp's greedy one under the same lazy
grammar sampler (llama_oracle.chain_greedy: one token per decode): free text while the model
writes no `<tool_call>`, the call's grammar from that token on.

The 1.5B model, asked about the weather, writes its call as a fenced JSON block rather than
a `<tool_call>` one: the grammar never triggers, and the block is parsed as llama-server's
Hermes 2 Pro parser parses it, into tool_calls. A logit bias on the `<tool_call>` token (25:
its logit is 22.1 below the likeliest one where the answer starts) makes it begin with one,
and the grammar then shapes the call (the model would write its JSON over several lines)."""

from __future__ import annotations

import json

import pytest

from pipeinfer.serve import tool_formats
from pipeinfer.api.hermes_calls import parse_hermes
from pipeinfer.api.tool_calls import NATIVE, OPEN, ToolChoice
from support.cached_models import cached_models
from support.llama_oracle import Chain, chain_greedy, llama_chat_tokens
from support.serve_oracle import open_tokenizer
from support.serving import KEY, Server, openai_client, serving
from support.streamed_calls import add_up, chunk_deltas

pytestmark = pytest.mark.slow

N_CTX = 1024
WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
ASK = [{"role": "user", "content": "What is the weather like in Paris today?"}]
PLAIN = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
BIAS = 25.0


@pytest.fixture(scope="module")
def pair():
    return cached_models("qwen-coder-1.5b", "qwen-coder-0.5b")


@pytest.fixture(scope="module", params=["pipeinfer", "iterative"])
def server(request, pair, tmp_path_factory):
    draft = ["-md", "qwen-coder-0.5b"] if request.param == "pipeinfer" else []
    srv = Server(tmp_path_factory.mktemp(f"serve-lazy-{request.param}"), 3,
                 "-m", str(pair[0]), *draft, "--strategy", request.param,
                 "--layer-split", "0,0.5,0.5", "-c", str(N_CTX), "--api-key", KEY,
                 "--alias", "qwen", "--parallel", "1", "--no-cache-prompt")
    yield from serving(srv, 400)


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server, 400)


@pytest.fixture(scope="module")
def tokenizer(pair):
    yield from open_tokenizer(pair[0])


_ANSWERS: dict[tuple, tuple[str, int]] = {}   # (both servers' tests ask the same)


def oracle(model, tokenizer, messages, n: int, bias=(), lazy: bool = True) -> str:
    """llama.cpp's greedy answer under the lazy grammar of tool_choice "auto" (without a
    grammar if not `lazy`), up to its end-of-generation token, the tool-call marks as
    text."""
    return oracle_tokens(model, tokenizer, messages, n, bias, lazy)[0]


def oracle_tokens(model, tokenizer, messages, n: int, bias=(),
                  lazy: bool = True) -> tuple[str, int]:
    """The oracle's answer and its tokens, counted as the server counts them (its
    end-of-generation token in)."""
    key = (json.dumps(messages), n, bias, lazy)
    if key not in _ANSWERS:
        _ANSWERS[key] = _oracle(model, tokenizer, messages, n, bias, lazy)
    return _ANSWERS[key]


def _oracle(model, tokenizer, messages, n: int, bias, lazy: bool) -> tuple[str, int]:
    auto = ToolChoice()
    triggers = tuple(tokenizer.single_token(t) for t in tool_formats.triggers(auto, NATIVE))
    chain = Chain(grammar=tool_formats.grammar(WEATHER, auto, NATIVE), triggers=triggers,
                  logit_bias=bias) if lazy else Chain(logit_bias=bias)
    prompt = llama_chat_tokens(model, messages, tools=WEATHER)
    tokens, _ = chain_greedy(model, prompt, n, chain, n_ctx=N_CTX)
    end = next((i for i, t in enumerate(tokens) if tokenizer.is_eog(t)), len(tokens))
    return b"".join(tokenizer.piece(t, special=True) for t in tokens[:end]).decode(), \
        min(end + 1, len(tokens))


def test_a_call_keeps_to_the_lazy_grammar_exactly(server, client, pair, tokenizer):
    """Once the model writes <tool_call>, the call is the grammar's (llama.cpp's answer under
    the same lazy grammar, not the model's free one), parsed into tool_calls, whole and
    streamed."""
    bias = ((tokenizer.single_token(OPEN), BIAS),)
    want = oracle(pair[0], tokenizer, ASK, 60, bias)
    assert want.startswith("<tool_call>\n") and want.endswith("\n</tool_call>")
    assert oracle(pair[0], tokenizer, ASK, 60, bias, lazy=False) != want   # (it matters)
    want_calls = [(c.name, json.loads(c.arguments)) for c in parse_hermes(want)[1]]
    assert want_calls == [("get_weather", {"city": "Paris"})]
    request = dict(model="qwen", messages=ASK, tools=WEATHER, max_tokens=60, temperature=0,
                   logit_bias={str(bias[0][0]): BIAS})
    answer = client.chat.completions.create(**request)
    choice = answer.choices[0]
    assert answer.usage.prompt_tokens == len(llama_chat_tokens(pair[0], ASK, tools=WEATHER))
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert [(c.function.name, json.loads(c.function.arguments))
            for c in choice.message.tool_calls] == want_calls
    deltas, finish, streamed = streamed_calls(client, request)
    assert deltas == want_calls and finish == "tool_calls" and not streamed


def test_a_plain_question_gets_free_text(server, client, pair, tokenizer):
    """No <tool_call>: the grammar never applies, the answer is the model's own text."""
    want = oracle(pair[0], tokenizer, PLAIN, 30)
    assert OPEN not in want and want
    answer = client.chat.completions.create(model="qwen", messages=PLAIN, tools=WEATHER,
                                            max_tokens=30, temperature=0)
    choice = answer.choices[0]
    assert choice.message.content == want and not choice.message.tool_calls
    assert choice.finish_reason == "stop"
    chunks = [c for c in client.chat.completions.create(
        model="qwen", messages=PLAIN, tools=WEATHER, max_tokens=30, temperature=0,
        stream=True) if c.choices]
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_a_natural_call_in_a_fenced_block_comes_back_as_tool_calls(server, client, pair,
                                                                   tokenizer):
    """No bias: the model writes its call as ```json {"name", "arguments"} ```, outside the
    grammar's trigger, so decoding stays free and exact against llama.cpp's (the tokens'
    bytes, from logprobs); the block comes back as tool_calls, as llama-server's parser reads it, whole
    and streamed, and no part of the fence is streamed as content."""
    want, n_tokens = oracle_tokens(pair[0], tokenizer, ASK, 100)
    assert OPEN not in want and "```json" in want and n_tokens < 100
    want_content, calls = parse_hermes(want)
    want_calls = [(c.name, json.loads(c.arguments)) for c in calls]
    assert want_calls == [("get_weather", {"city": "Paris"})]
    request = dict(model="qwen", messages=ASK, tools=WEATHER, max_tokens=100, temperature=0)
    answer = client.chat.completions.create(logprobs=True, **request)
    choice = answer.choices[0]
    assert answer.usage.completion_tokens == n_tokens
    assert b"".join(bytes(e.bytes) for e in choice.logprobs.content) == want.encode()
    assert choice.finish_reason == "tool_calls" and choice.message.content == want_content
    assert [(c.function.name, json.loads(c.function.arguments))
            for c in choice.message.tool_calls] == want_calls
    deltas, finish, streamed = streamed_calls(client, request)
    assert deltas == want_calls and finish == "tool_calls"
    assert streamed == (want_content or "") and "`" not in streamed


def streamed_calls(client, request: dict) -> tuple[list, str, str]:
    """The request streamed: its calls (name, parsed arguments) as the deltas add up, the
    last finish_reason, and the content streamed."""
    chunks = [c for c in client.chat.completions.create(stream=True, **request) if c.choices]
    deltas = [(name, json.loads(arguments))
              for _, name, arguments in add_up(chunk_deltas(chunks))]
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks)
    return deltas, chunks[-1].choices[0].finish_reason, streamed
