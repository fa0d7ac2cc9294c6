"""Tool calls in answers (api/tool_calls.py): Qwen2.5's / Hermes' `<tool_call>` blocks and
the generic format's JSON replies parsed into OpenAI's tool_calls or content, whole and
streamed."""

from __future__ import annotations

import json

from pipeinfer.api.tool_calls import (GENERIC, NATIVE, GenericStream, extract_generic, parse,
                                      response_so_far, stream)
from support.streamed_calls import add_up

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def test_blocks_become_calls_and_the_text_before_stays_content():
    content, calls = parse(NATIVE, CALL)
    assert content is None and [c.name for c in calls] == ["get_weather"]
    assert json.loads(calls[0].arguments) == {"city": "Paris"}
    assert calls[0].json()["type"] == "function" and calls[0].id.startswith("call_")
    content, calls = parse(NATIVE, "Let me look.\n" + CALL + "\n" + CALL.replace("Paris", "Oslo"))
    assert content == "Let me look." and [json.loads(c.arguments)["city"]
                                          for c in calls] == ["Paris", "Oslo"]
    assert parse(NATIVE, "no calls here") == ("no calls here", [])
    broken = "<tool_call>\n{not json}\n</tool_call>"
    assert parse(NATIVE, broken) == (broken, [])        # kept as text, not lost
    assert parse(NATIVE, '{"a": 1}') == ('{"a": 1}', [])


def test_streamed_text_stops_at_a_call_and_the_call_streams():
    native = stream(NATIVE)
    sent = [native.push(p) for p in ["Let me ", "look.<tool", "_call>\n{\"name\": ",
                                     "\"f\", \"arguments\": {}}\n</tool_call>"]]
    assert [text for text, _ in sent] == ["Let me", " look.", "", ""]
    assert sent[2][1] == [] and [d["function"] for d in sent[3][1]] == [
        {"name": "f", "arguments": "{}"}]     # (its first delta: the arguments so far)
    assert add_up(sent[3][1])[0][1:] == ("f", "{}")
    assert native.finish() == ("", [], True)
    plain = stream(NATIVE)
    assert plain.push("a <tool") == ("a", []) and plain.finish() == (" <tool", [], False)
    broken = stream(NATIVE)
    assert broken.push('x<tool_call>{"name": oops') == ("x", [])
    assert broken.finish() == ('<tool_call>{"name": oops', [], False)


def test_generic_replies_become_calls_or_content():
    content, calls = extract_generic('{ "tool_call": { "name": "get_weather", '
                                     '"arguments": { "city": "Paris" } } }')
    assert content is None and [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"})]
    content, calls = extract_generic('{"tool_calls": [{"name": "f", "arguments": {}, '
                                     '"id": "call_a"}, {"name": "g", "arguments": {"x": 1},'
                                     ' "id": "call_b"}]}')
    assert [(c.name, c.arguments) for c in calls] == [("f", "{}"), ("g", '{"x": 1}')]
    assert all(c.id.startswith("call_") for c in calls) and calls[0].id != calls[1].id
    assert "call_a" not in (calls[0].id, calls[1].id)   # (the server's ids: call_stream.py)
    assert extract_generic('{"response": "Hi!\nHow are \\u00e9 you?"}') == (
        "Hi!\nHow are é you?", [])   # (the grammar lets strings hold raw newlines)
    assert extract_generic('{"response": "cut sho') == ("cut sho", [])   # max_tokens
    assert extract_generic('{"tool_call": {"name": "f", "argu') == (
        '{"tool_call": {"name": "f", "argu', [])
    assert extract_generic("plain") == ("plain", [])
    assert parse(GENERIC, '{"response": "x"}') == ("x", [])
    assert parse(NATIVE, '{"response": "x"}') == ('{"response": "x"}', [])


def test_a_generic_response_streams_as_it_is_decoded():
    assert response_so_far('{ "response": "a\\') == ("a", False)   # (escape not complete)
    assert response_so_far('{"response": "\\ud83d') == ("", False)
    assert response_so_far('{"response": "\\ud83d\\ude00"') == ("\U0001F600", True)
    assert response_so_far('{"tool_call": {') is None
    stream = GenericStream()
    pieces = ['{', ' "response"', ': "Hel', 'lo\\', 'n wor', 'ld\\u00', 'e9"', ' }']
    sent = [stream.push(p) for p in pieces]
    assert sent == [(t, []) for t in ["", "", "Hel", "lo", "\n wor", "ld", "é", ""]]
    assert stream.finish() == ("", [], False)
    call = GenericStream()
    sent = [call.push(p) for p in ['{"tool_call": ', '{"name": "f", "arguments": {}}}']]
    assert [text for text, _ in sent] == ["", ""] and sent[0][1] == []
    assert add_up(sent[1][1])[0][1:] == ("f", "{}") and call.finish() == ("", [], True)
    cut = GenericStream()
    assert cut.push('{"tool_call": {"name"') == ("", [])
    assert cut.finish() == ('{"tool_call": {"name"', [], False)   # (cut short: kept as text)
