"""Tool calls served for real: a 3-rank job of Qwen2.5-Coder 0.5B (its template has tool
support) with pipeinfer's strategy, asked with the `openai` client. The prompt with tools (and
with a history of calls and their results) is llama-cpp-python's Jinja2ChatFormatter's, the
answer llama.cpp's greedy one, and its `<tool_call>` block comes back as tool_calls."""

from __future__ import annotations

import json

import pytest

from pipeinfer.model import models
from pipeinfer.serve.tool_calls import extract
from test_chat_template import llama_chat_tokens
from test_pipeline_mpi import llama_greedy
from test_serve import KEY, Server, open_tokenizer, openai_client, serving

N_CTX = 1024
WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
ASK = [{"role": "user", "content": "What is the weather like in Paris today?"}]


@pytest.fixture(scope="module")
def qwen():
    try:
        return (models.resolve_model("qwen-coder-0.5b", fetch_missing=False),
                models.resolve_model("qwen-coder-0.5b-q4_0", fetch_missing=False))
    except models.ModelError as err:
        pytest.skip(f"Qwen2.5-Coder 0.5B is not cached: {err}")


@pytest.fixture(scope="module")
def server(qwen, tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp("serve-tools"), 3, "-m", str(qwen[0]), "-md",
                 str(qwen[1]), "--strategy", "pipeinfer", "--layer-split", "0,0.5,0.5",
                 "-c", str(N_CTX), "--api-key", KEY, "--alias", "qwen", "--parallel", "1",
                 "--no-cache-prompt")
    yield from serving(srv, 240)


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server, 240)


@pytest.fixture(scope="module")
def tokenizer(qwen):
    yield from open_tokenizer(qwen[0])


def llama_answer(model, tokenizer, prompt: list[int], n: int) -> str:
    """llama.cpp's greedy answer up to its end-of-generation token, the tool-call marks as
    text."""
    tokens = llama_greedy(model, prompt, n, n_ctx=N_CTX, repack=True)
    end = next((i for i, t in enumerate(tokens) if tokenizer.is_eog(t)), len(tokens))
    marks = {t for t in range(tokenizer.n_vocab - 400, tokenizer.n_vocab)
             if tokenizer.piece(t, special=True) in (b"<tool_call>", b"</tool_call>")}
    return b"".join(tokenizer.piece(t, special=t in marks) for t in tokens[:end]).decode()


def test_a_tool_call_comes_back_parsed(server, client, qwen, tokenizer):
    prompt = llama_chat_tokens(qwen[0], ASK, tools=WEATHER)
    want_content, want_calls = extract(llama_answer(qwen[0], tokenizer, prompt, 60),
                                       {"get_weather"})
    assert want_calls, "the model does not call the tool here: pick another question"
    answer = client.chat.completions.create(model="qwen", messages=ASK, tools=WEATHER,
                                            max_tokens=60, temperature=0)
    choice = answer.choices[0]
    assert answer.usage.prompt_tokens == len(prompt)   # the template's rendering of tools
    assert choice.finish_reason == "tool_calls" and choice.message.content == want_content
    assert [(c.function.name, json.loads(c.function.arguments))
            for c in choice.message.tool_calls] == [
        (c.name, json.loads(c.arguments)) for c in want_calls]
    stream = client.chat.completions.create(model="qwen", messages=ASK, tools=WEATHER,
                                            max_tokens=60, temperature=0, stream=True)
    chunks = [c for c in stream if c.choices]
    deltas = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert [(d.function.name, d.function.arguments) for d in deltas] == [
        (c.function.name, c.function.arguments) for c in choice.message.tool_calls]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == (want_content or "")


def test_the_tools_result_goes_back_through_the_template(server, client, qwen, tokenizer):
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    history = ASK + [{"role": "assistant", "content": None, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": "call_1",
                      "content": '{"temperature": 18, "sky": "cloudy"}'}]
    as_template_gets_it = [*history[:1], dict(history[1], tool_calls=[
        dict(call, function={"name": "get_weather", "arguments": {"city": "Paris"}})]),
        history[2]]
    prompt = llama_chat_tokens(qwen[0], as_template_gets_it, tools=WEATHER)
    want = llama_answer(qwen[0], tokenizer, prompt, 40)
    answer = client.chat.completions.create(model="qwen", messages=history, tools=WEATHER,
                                            max_tokens=40, temperature=0)
    assert answer.usage.prompt_tokens == len(prompt)
    assert answer.choices[0].message.content == extract(want, {"get_weather"})[0]
    assert "18" in answer.choices[0].message.content
