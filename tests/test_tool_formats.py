"""How a model is asked for tool calls (serve/tool_formats.py), with the real templates:
SmolLM2's has no tool support and gets llama-server's generic format (its prompt written out
here as llama-server builds it), Qwen2.5's renders tools and gets the native one; the
grammars of tool_choice "required" / a named function accept exactly the calls they should,
token by token through llama.cpp's grammar sampler."""

from __future__ import annotations

import json

import pytest

from pipeinfer.model.grammar import GrammarError
from pipeinfer.model.tokenizer import Tokenizer
from pipeinfer.serve import tool_formats
from pipeinfer.api.tool_calls import GENERIC, NATIVE, ToolChoice
from support.cached_models import cached_models
from support.llama_oracle import llama_chat_tokens

pytestmark = pytest.mark.smollm2

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"$ref": "#/$defs/city"}},
                   "required": ["city"], "$defs": {"city": {"type": "string"}}}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
    "required": ["zone"]}}}
HISTORY = [{"role": "user", "content": "Weather in Paris?"},
           {"role": "assistant", "content": None, "tool_calls": [
               {"id": "c1", "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
           {"role": "tool", "tool_call_id": "c1", "content": "18C"}]


@pytest.fixture(scope="module")
def smol(smollm2):
    tok = Tokenizer(smollm2)
    yield tok
    tok.close()


@pytest.fixture(scope="module")
def qwen():
    tok = Tokenizer(cached_models("qwen-coder-0.5b")[0])
    yield tok
    tok.close()


def test_smollm2_gets_the_generic_format_as_llama_server_writes_it(smol):
    template = smol.chat_template()
    assert tool_formats.tool_format(template) == GENERIC
    tools_text = json.dumps([WEATHER], indent=2)
    example = json.dumps({"tool_calls": [{"name": "tool_name", "arguments": {
        "arg1": "some_value"}, "id": "call_1___"}]}, indent=2)
    system = ("Be brief.\n\nRespond in JSON format, either with `tool_call` (a request to "
              "call tools) or with `response` reply to the user's request\n\nYou can call "
              "any of the following tools to satisfy the user's requests: " + tools_text +
              "\n\nExample tool call syntax:\n\n" + example + "\n\n")
    as_llama_server = [
        {"role": "system", "content": system}, HISTORY[0],
        {"role": "assistant", "content": json.dumps({"tool_calls": [
            {"name": "get_weather", "arguments": {"city": "Paris"}, "id": "c1"}]}, indent=2)},
        {"role": "user", "content": json.dumps({"tool_response": {
            "content": "18C", "tool_call_id": "c1"}}, indent=2)}]
    messages = [{"role": "system", "content": "Be brief."}, *HISTORY]
    ours = tool_formats.conversation(template, messages, [WEATHER], GENERIC)
    assert smol.chat_tokens(ours, tools=[WEATHER]) == llama_chat_tokens(
        smol.path, as_llama_server)
    without_tools = tool_formats.conversation(template, HISTORY, [], GENERIC)
    assert without_tools[0] == HISTORY[0] and "tool_response" in without_tools[2]["content"]


def test_qwen_gets_the_native_format_through_its_own_template(qwen):
    template = qwen.chat_template()
    assert tool_formats.tool_format(template) == NATIVE
    assert tool_formats.conversation(template, HISTORY, [WEATHER], NATIVE) == HISTORY
    # auto: the required grammar, lazy (it applies from a <tool_call> token on)
    assert tool_formats.grammar([WEATHER], ToolChoice(), NATIVE) == tool_formats.grammar(
        [WEATHER], ToolChoice(required=True), NATIVE)
    assert tool_formats.triggers(ToolChoice(), NATIVE) == ("<tool_call>",)
    assert tool_formats.triggers(ToolChoice(), GENERIC) == ()


def accepts(tokenizer, gbnf: str, text: str, triggers=()) -> bool:
    """Whether llama.cpp's grammar sampler (lazy, with `triggers`) lets the model write
    `text` (as the tokenizer spells it, special tokens too) and then end."""
    grammar = tokenizer.grammar(gbnf, triggers)
    try:
        for token in tokenizer.tokenize(text, add_special=False):
            if not grammar.allows(token):
                return False
            grammar.accept(token)
        return grammar.allows(grammar.eos)
    finally:
        grammar.close()


def test_a_required_native_call_is_a_tool_call_block_of_a_valid_call(qwen):
    required = tool_formats.grammar([WEATHER, TIME], ToolChoice(required=True), NATIVE)
    call = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    block = f"<tool_call>\n{call}\n</tool_call>"
    assert qwen.tokenize("<tool_call>", add_special=False) == [151657]   # (one token)
    assert accepts(qwen, required, block)
    assert accepts(qwen, required, '<tool_call>\n{"name": "get_time", "arguments": '
                                   '{"zone": "CET"}}\n</tool_call>')
    for wrong in [call, "Sure! " + block, block + "\n" + block,
                  block.replace("get_weather", "get_rain"),
                  block.replace('"city"', '"town"'),
                  '<tool_call>\n{"name": "get_time", "arguments": {"zone": "EST"}}\n'
                  '</tool_call>']:
        assert not accepts(qwen, required, wrong), wrong
    named = tool_formats.grammar([WEATHER, TIME], ToolChoice(True, "get_time"), NATIVE)
    assert not accepts(qwen, named, block)
    parallel = tool_formats.grammar([WEATHER], ToolChoice(True, None, True), NATIVE)
    assert accepts(qwen, parallel, block + "\n" + block)


def test_an_auto_native_answer_is_free_until_its_call(qwen):
    """tool_choice "auto": any text, and a <tool_call> block (after text or not) only if it
    is a valid call, ending the answer."""
    auto = ToolChoice()
    gbnf, triggers = (tool_formats.grammar([WEATHER, TIME], auto, NATIVE),
                      tool_formats.triggers(auto, NATIVE))
    block = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    for right in ["Hello! It is sunny.", "", block, "Let me look.\n" + block,
                  '{"name": "get_weather"}']:   # (no tags: not a call the grammar sees)
        assert accepts(qwen, gbnf, right, triggers), right
    for wrong in [block.replace("get_weather", "get_rain"), "Sure. " + block[:-1],
                  block + " Done.", "Hm <tool_call> get_weather(Paris)"]:
        assert not accepts(qwen, gbnf, wrong, triggers), wrong


def test_the_generic_reply_is_a_call_or_a_response(smol):
    auto = tool_formats.grammar([WEATHER, TIME], ToolChoice(), GENERIC)
    call = '{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}'
    assert accepts(smol, auto, call) and accepts(smol, auto, '{"response": "Hello!"}')
    assert not accepts(smol, auto, "Hello!")
    required = tool_formats.grammar([WEATHER, TIME], ToolChoice(required=True), GENERIC)
    assert accepts(smol, required, call)
    assert not accepts(smol, required, '{"response": "Hello!"}')
    named = tool_formats.grammar([WEATHER, TIME], ToolChoice(True, "get_time"), GENERIC)
    assert not accepts(smol, named, call)
    assert accepts(smol, named, '{"tool_call": {"name": "get_time", "arguments": '
                                '{"zone": "UTC"}}}')
    parallel = tool_formats.grammar([WEATHER], ToolChoice(True, None, True), GENERIC)
    assert accepts(smol, parallel, '{"tool_calls": [{"name": "get_weather", "arguments": '
                                   '{"city": "Oslo"}, "id": "call_1"}]}')
    with pytest.raises(GrammarError):
        bad = {"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}}}
        tool_formats.grammar([bad], ToolChoice(required=True), GENERIC)
