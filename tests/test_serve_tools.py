"""Tool calls served for real: a 3-rank job of Qwen2.5-Coder 0.5B (its template has tool
support: the native format) with pipeinfer's strategy, asked with the `openai` client. The
prompt with tools (and with a history of calls and their results) is llama-cpp-python's
Jinja2ChatFormatter's, the answer llama.cpp's greedy one, and its call comes back as
tool_calls (under tool_choice "auto"'s lazy grammar; the model writes this one as a bare
JSON object, which a stream sends whole at the end). With tool_choice "required" or a named
function the answer is llama.cpp's greedy one under the grammar that forces a `<tool_call>`
block (one token per decode), while the server speculates under it; streamed, the block's
call goes out as it is written."""

from __future__ import annotations

import json

import pytest

from pipeinfer.serve import tool_formats
from pipeinfer.api.hermes_calls import parse_hermes
from pipeinfer.api.tool_calls import NATIVE, ToolChoice
from support.cached_models import cached_models
from support.llama_oracle import Chain, chain_greedy, llama_chat_tokens, llama_greedy
from support.serve_oracle import open_tokenizer
from support.serving import KEY, Server, openai_client, serving
from support.streamed_calls import add_up, sdk_stream

pytestmark = pytest.mark.slow

N_CTX = 1024
WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a time zone",
    "parameters": {"type": "object", "properties": {
        "zone": {"type": "string", "enum": ["UTC", "CET", "EST"]}}, "required": ["zone"]}}}
ASK = [{"role": "user", "content": "What is the weather like in Paris today?"}]


@pytest.fixture(scope="module")
def qwen():
    return cached_models("qwen-coder-0.5b", "qwen-coder-0.5b-q4_0")


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


def llama_answer(model, tokenizer, prompt: list[int], n: int, gbnf: str | None = None,
                 triggers: tuple[int, ...] = ()) -> str:
    """llama.cpp's greedy answer (under the grammar `gbnf` if given, lazy with `triggers`)
    up to its end-of-generation token, the tool-call marks as text."""
    if gbnf is None:
        tokens = llama_greedy(model, prompt, n, n_ctx=N_CTX, repack=True)
    else:
        tokens, _ = chain_greedy(model, prompt, n, Chain(grammar=gbnf, triggers=triggers),
                                 n_ctx=N_CTX)
    end = next((i for i, t in enumerate(tokens) if tokenizer.is_eog(t)), len(tokens))
    marks = {t for t in range(tokenizer.n_vocab - 400, tokenizer.n_vocab)
             if tokenizer.piece(t, special=True) in (b"<tool_call>", b"</tool_call>")}
    return b"".join(tokenizer.piece(t, special=t in marks) for t in tokens[:end]).decode()


def test_a_tool_call_comes_back_parsed(server, client, qwen, tokenizer):
    prompt = llama_chat_tokens(qwen[0], ASK, tools=WEATHER)
    auto = ToolChoice()   # (its lazy grammar: from the model's <tool_call> on)
    lazy = tool_formats.grammar(WEATHER, auto, NATIVE), tuple(
        tokenizer.single_token(t) for t in tool_formats.triggers(auto, NATIVE))
    want_content, want_calls = parse_hermes(llama_answer(qwen[0], tokenizer, prompt, 60, *lazy))
    assert want_calls, "the model does not call the tool here: pick another question"
    answer = client.chat.completions.create(model="qwen", messages=ASK, tools=WEATHER,
                                            max_tokens=60, temperature=0)
    choice = answer.choices[0]
    assert answer.usage.prompt_tokens == len(prompt)   # the template's rendering of tools
    assert choice.finish_reason == "tool_calls" and choice.message.content == want_content
    assert [(c.function.name, c.function.arguments) for c in choice.message.tool_calls] \
        == [(c.name, c.arguments) for c in want_calls]     # (the model's text of them)
    # streamed (this model writes a bare {"name", "arguments"} object, whole at the end),
    # added up by the SDK to the same call
    got = sdk_stream(client, model="qwen", messages=ASK, tools=WEATHER, max_tokens=60,
                     temperature=0)
    assert got.calls() == [(c.function.name, c.function.arguments)
                           for c in choice.message.tool_calls]
    assert got.final.choices[0].finish_reason == "tool_calls"
    assert "".join(got.content) == (want_content or "") and add_up(got.deltas)


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
    assert answer.choices[0].message.content == parse_hermes(want)[0]
    assert "18" in answer.choices[0].message.content


@pytest.mark.parametrize("mode", ["required", "named"])
def test_a_forced_call_keeps_to_its_grammar_exactly(server, client, qwen, tokenizer, mode):
    """"required" and a named function: the answer is a <tool_call> block of a valid call,
    llama.cpp's greedy one under the same grammar; streamed as it is written, its deltas
    adding up to the same call."""
    tools = [WEATHER[0], TIME]
    choice = ToolChoice(True, "get_time" if mode == "named" else None)
    tool_choice = ({"type": "function", "function": {"name": "get_time"}}
                   if mode == "named" else "required")
    prompt = llama_chat_tokens(qwen[0], ASK, tools=tools)
    want = llama_answer(qwen[0], tokenizer, prompt, 60,
                        tool_formats.grammar(tools, choice, NATIVE))
    assert want.startswith("<tool_call>\n") and want.endswith("\n</tool_call>")
    want_calls = [(c.name, json.loads(c.arguments)) for c in parse_hermes(want)[1]]
    request = dict(model="qwen", messages=ASK, tools=tools, tool_choice=tool_choice,
                   max_tokens=60, temperature=0)
    answer = client.chat.completions.create(**request)
    choice_ = answer.choices[0]
    assert answer.usage.prompt_tokens == len(prompt)
    assert choice_.finish_reason == "tool_calls" and choice_.message.content is None
    assert [(c.function.name, json.loads(c.function.arguments))
            for c in choice_.message.tool_calls] == want_calls
    if mode == "named":
        assert [name for name, _ in want_calls] == ["get_time"]
    got = sdk_stream(client, **request)    # (the <tool_call> block as it is written)
    assert got.calls() == [(c.function.name, c.function.arguments)
                           for c in choice_.message.tool_calls]
    assert [call[1:] for call in add_up(got.deltas)] == got.calls()
    assert len(got.arguments) > 1 and "".join(got.arguments) == got.calls()[0][1]
    assert got.final.choices[0].finish_reason == "tool_calls" and not got.content


def test_tool_choice_none_leaves_the_tools_out(server, client, qwen, tokenizer):
    prompt = llama_chat_tokens(qwen[0], ASK)
    want = llama_answer(qwen[0], tokenizer, prompt, 30)
    answer = client.chat.completions.create(model="qwen", messages=ASK, tools=WEATHER,
                                            tool_choice="none", max_tokens=30, temperature=0)
    assert answer.usage.prompt_tokens == len(prompt)
    assert answer.choices[0].message.content == want
    assert not answer.choices[0].message.tool_calls
