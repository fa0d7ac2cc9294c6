"""Tool calls with a model whose template has no tool support, served for real: a 3-rank job
of SmolLM2 (itself as the draft, pipeinfer's strategy: drafts verified in runs of several
tokens) asked with the `openai` client. The model gets llama-server's generic format
(serve/tool_formats.py, its prompt checked in test_tool_formats.py): the reply is a JSON object
constrained by a grammar, parsed into tool_calls or content. Every answer is llama.cpp's
greedy one under the same grammar (llama_oracle.chain_greedy: one token per decode), in all
four tool_choice modes, whole and streamed (a call as it is written, its pieces adding up
to the whole answer's call, through the `openai` SDK's stream helper)."""

from __future__ import annotations

import json

import openai
import pytest

from pipeinfer.serve import tool_formats
from pipeinfer.api.tool_calls import GENERIC, ToolChoice, extract_generic
from support.llama_oracle import Chain, chain_greedy
from support.serve_oracle import N_CTX, chat_tokens, expected
from support.serving import KEY, Server, serving
from support.streamed_calls import add_up, sdk_stream

pytestmark = [pytest.mark.slow, pytest.mark.smollm2]

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a time zone",
    "parameters": {"type": "object", "properties": {
        "zone": {"type": "string", "enum": ["UTC", "CET", "EST"]}}, "required": ["zone"]}}}
ASK = [{"role": "user", "content": "What is the weather like in Paris today?"}]


@pytest.fixture(scope="module")
def server(smollm2, tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp("serve-tools-generic"), 3, "-m", str(smollm2),
                 "-md", str(smollm2), "--strategy", "pipeinfer", "--layer-split",
                 "0,0.5,0.5", "-c", str(N_CTX), "--api-key", KEY, "--alias", "smollm2",
                 "--parallel", "1", "--no-cache-prompt")
    yield from serving(srv)


def oracle(model, tokenizer, messages, tools, choice: ToolChoice, n: int, bias=()):
    """(prompt tokens, llama.cpp's greedy reply under the generic format's grammar)."""
    template = tokenizer.chat_template()
    prompt = tokenizer.chat_tokens(
        tool_formats.conversation(template, messages, tools, GENERIC), tools=tools)
    gbnf = tool_formats.grammar(tools, choice, GENERIC)
    tokens, _ = chain_greedy(model, prompt, n, Chain(grammar=gbnf, logit_bias=bias),
                             n_ctx=N_CTX)
    end = next((i for i, t in enumerate(tokens) if tokenizer.is_eog(t)), len(tokens))
    return prompt, tokenizer.detokenize(tokens[:end])


def calls_of(message) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments))
            for c in message.tool_calls or []]


def exact_calls(message) -> list[tuple[str, str]]:
    return [(c.function.name, c.function.arguments) for c in message.tool_calls or []]


def streamed(client, **request):
    """(content, [(name, arguments)], finish_reason, content pieces, pieces of arguments)
    of an answer streamed through the `openai` SDK's stream helper."""
    got = sdk_stream(client, **request)
    add_up(got.deltas)    # (shaped as OpenAI streams a call)
    return "".join(got.content), got.calls(), got.final.choices[0].finish_reason, \
        got.content, got.arguments


@pytest.mark.parametrize("mode", ["auto", "required", "named"])
def test_a_call_in_every_mode_that_allows_one(server, client, smollm2, tokenizer, mode):
    tools = [WEATHER, TIME]
    choice = {"auto": ToolChoice(), "required": ToolChoice(required=True),
              "named": ToolChoice(True, "get_time")}[mode]
    tool_choice = {"auto": "auto", "required": "required",
                   "named": {"type": "function", "function": {"name": "get_time"}}}[mode]
    prompt, want = oracle(smollm2, tokenizer, ASK, tools, choice, 60)
    _, want_calls = extract_generic(want)
    assert want_calls, f"the model does not call a tool here ({want!r}): ask another way"
    request = dict(model="smollm2", messages=ASK, tools=tools, tool_choice=tool_choice,
                   max_tokens=60, temperature=0)
    answer = client.chat.completions.create(**request)
    choice_ = answer.choices[0]
    assert answer.usage.prompt_tokens == len(prompt)
    assert choice_.finish_reason == "tool_calls" and choice_.message.content is None
    assert exact_calls(choice_.message) == [(c.name, c.arguments) for c in want_calls]
    if mode == "named":
        assert [name for name, _ in calls_of(choice_.message)] == ["get_time"]
    content, calls, finish, _, arguments = streamed(client, **request)
    assert (content, calls, finish) == ("", exact_calls(choice_.message), "tool_calls")
    assert len(arguments) > 1 and "".join(arguments) == "".join(a for _, a in calls)


def test_a_response_comes_back_as_content_streamed_as_it_is_written(server, client,
                                                                      smollm2, tokenizer):
    """The generic reply {"response": ...}: here the model is steered to it by banning the
    tokens that spell "tool" (it otherwise always calls), and its text streams piece by
    piece, decoded from the JSON string."""
    ban = [tokenizer.tokenize(s, add_special=False) for s in ("t", "to", "too", "tool")]
    assert all(len(t) == 1 for t in ban)
    bias = tuple((t[0], -100.0) for t in ban)
    messages = [{"role": "user", "content": "What is 2 + 2?"}]
    _, want = oracle(smollm2, tokenizer, messages, [WEATHER], ToolChoice(), 40, bias)
    want_content, want_calls = extract_generic(want)
    assert not want_calls and want_content and want.lstrip().startswith("{")
    request = dict(model="smollm2", messages=messages, tools=[WEATHER], max_tokens=40,
                   temperature=0, logit_bias={str(t): b for t, b in bias})
    answer = client.chat.completions.create(**request)
    assert answer.choices[0].message.content == want_content
    assert answer.choices[0].message.tool_calls is None
    assert answer.choices[0].finish_reason == "stop"
    content, calls, finish, pieces, _ = streamed(client, **request)
    assert (content, calls, finish) == (want_content, [], "stop") and len(pieces) > 1


def test_tool_choice_none_is_a_plain_chat(server, client, smollm2, tokenizer):
    answer = client.chat.completions.create(model="smollm2", messages=ASK, tools=[WEATHER],
                                            tool_choice="none", max_tokens=24, temperature=0)
    want, _, reason = expected(smollm2, tokenizer, chat_tokens(tokenizer, ASK), 24)
    assert answer.choices[0].message.content == want
    assert answer.choices[0].finish_reason == reason and not answer.choices[0].message.tool_calls


def test_a_call_and_its_result_in_the_history(server, client, smollm2, tokenizer):
    """The history's call and the tool's answer go to the model as JSON text (the template
    renders neither), and the next reply is llama.cpp's."""
    history = ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 18}'}]
    as_template_gets_it = [*history[:1], dict(history[1], tool_calls=[dict(
        history[1]["tool_calls"][0], function={"name": "get_weather",
                                               "arguments": {"city": "Paris"}})]), history[2]]
    prompt, want = oracle(smollm2, tokenizer, as_template_gets_it, [WEATHER],
                          ToolChoice(required=True), 40)
    answer = client.chat.completions.create(model="smollm2", messages=history,
                                            tools=[WEATHER], tool_choice="required",
                                            max_tokens=40, temperature=0)
    assert answer.usage.prompt_tokens == len(prompt)
    assert calls_of(answer.choices[0].message) == [
        (c.name, json.loads(c.arguments)) for c in extract_generic(want)[1]]


def test_bad_tool_requests_are_400s_naming_the_parameter(server, client):
    cases = [("tool_choice", dict(tools=[WEATHER], tool_choice={
                 "type": "function", "function": {"name": "get_rain"}})),
             ("tool_choice", dict(tool_choice="required")),
             ("tools", dict(tools=[{"type": "function", "function": {"description": "x"}}])),
             ("tools", dict(tools=[{"type": "function", "function": {
                 "name": "f", "parameters": {"type": "object", "properties": {
                     "a": {"$ref": "#/nowhere"}}}}}], tool_choice="required"))]
    for param, extra in cases:
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model="smollm2", messages=ASK, max_tokens=4,
                                           **extra)
        assert err.value.body["param"] == param, extra
