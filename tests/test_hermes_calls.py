"""The native tool-call format parsed as llama-server's Hermes 2 Pro parser parses it
(api/hermes_calls.py; llama.cpp common/chat-parser.cpp, common_chat_parse_hermes_2_pro):
every shape its open regex takes, what it leaves as content, and streamed: the deltas add up
to the whole answer's content and calls, and text that may open a call (a "```", a "{" ...)
is never sent before it is known not to. How `<tool_call>` blocks stream call by call:
test_tool_call_stream.py."""

from __future__ import annotations

import json

import pytest

from pipeinfer.api.hermes_calls import HermesStream, may_open, parse_hermes
from support.streamed_calls import splits, streamed

ARGS = '{"city": "Paris"}'
OBJ = '{"name": "get_weather", "arguments": ' + ARGS + '}'
FENCED = '```json\n{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Paris"\n  }\n}\n```'

# (answer, its content, its calls' names): the shapes llama.cpp's open regex takes
SHAPES = [
    ("<tool_call>\n" + OBJ + "\n</tool_call>", None, ["get_weather"]),
    (FENCED, None, ["get_weather"]),                      # Qwen2.5-Coder 1.5B writes this
    ("```xml\n" + OBJ + "\n```", None, ["get_weather"]),
    ("```\n" + OBJ + "\n```", None, ["get_weather"]),
    ("```json\n<tool_call>" + OBJ + "</tool_call>\n```", None, ["get_weather"]),
    (OBJ, None, ["get_weather"]),                          # bare
    ("  \n" + OBJ + "\n", None, ["get_weather"]),
    *[(f"{tag}{OBJ}</{tag[1:]}", None, ["get_weather"]) for tag in (
        "<tool_call>", "<function_call>", "<tool>", "<tools>", "<response>", "<json>",
        "<xml>", "<JSON>")],
    ("<function=get_weather>" + ARGS + "</function>", None, ["get_weather"]),
    ('<function name="get_weather">' + ARGS + "</function>", None, ["get_weather"]),
    ("Let me check.\n\n" + FENCED, "Let me check.", ["get_weather"]),
    ("Let me check. " + FENCED + "\n\nOne moment.", "Let me check. One moment.",
     ["get_weather"]),                 # (llama.cpp joins the texts around a call as they are)
    ("<tool_call>" + OBJ + "</tool_call>\n<tool_call>" + OBJ.replace("Paris", "Oslo")
     + "</tool_call>", None, ["get_weather", "get_weather"]),
    (FENCED + "\n" + FENCED, None, ["get_weather", "get_weather"]),
    # any name is a call: llama.cpp does not check it against the request's tools
    ('```json\n{"name": "not_a_tool", "arguments": {}}\n```', None, ["not_a_tool"]),
]

# answers that stay content, whole, with no calls
CONTENT = [
    "The weather in Paris is mild.",
    '```python\nprint({"name": 1})\n```',           # ("{" then not "name": no call)
    '```json\n{"city": "Paris"}\n```',              # ("name" must be the first key)
    '{"a": 1} is a dict',
    "<tool_call>\n" + OBJ,                           # the tag not closed
    "```json\n" + OBJ,                               # the fence not closed
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": Paris}}\n</tool_call>',
    '```json\n{"name": "get_weather", "arguments": {"city": "Par',     # cut short
    '```json\n{"name": "get_weather", "arguments": {"x": NaN}}\n```',  # not JSON to llama.cpp
    "<function=get_weather>{\"city\": }</function>",
    "<tool_call>" + OBJ + "</tool_call>\n<tool_call>{\"name\": oops</tool_call>",  # 1 bad: all
    '<tool_call>{"name": 3, "arguments": {}}</tool_call>',
]


@pytest.mark.parametrize("answer, content, names", SHAPES)
def test_a_call_in_each_shape_llama_server_parses(answer, content, names):
    got, calls = parse_hermes(answer)
    assert got == content and [c.name for c in calls] == names
    assert json.loads(calls[0].arguments) == {"city": "Paris"} or names == ["not_a_tool"]
    assert all(c.id.startswith("call_") for c in calls)


def test_arguments_are_the_models_text_and_ids_the_servers():
    """A call's arguments are the model's text of them (llama.cpp dumps them again, compact
    and ASCII), the string's text if they are a string, "{}" if there are none; a key
    written twice counts with its first value; the id is the server's, not the model's."""
    _, [call] = parse_hermes('{"name": "f", "arguments": {"q": "caf\u00e9",\n "n": [1, 2.5]}}')
    assert call.arguments == '{"q": "caf\u00e9",\n "n": [1, 2.5]}'
    _, [call] = parse_hermes('<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}", '
                             '"id": "call_7"}</tool_call>')
    assert call.arguments == '{"a": 1}' and call.id.startswith("call_") and call.id != "call_7"
    _, [call] = parse_hermes('<tool_call>{"name": "f"}</tool_call>')
    assert call.arguments == "{}"      # (llama.cpp: "", which no client can parse)
    _, [call] = parse_hermes('<function=f> {"a":  1} </function>')
    assert call.arguments == '{"a":  1}'
    _, [call] = parse_hermes('{"name": "f", "arguments": {"a": 1}, "arguments": [2], '
                             '"name": "g"}')
    assert (call.name, call.arguments) == ("f", '{"a": 1}')


@pytest.mark.parametrize("answer", CONTENT)
def test_what_is_not_a_whole_call_stays_content(answer):
    assert parse_hermes(answer) == (answer, [])


@pytest.mark.parametrize("answer", [a for a, _, _ in SHAPES] + CONTENT + [
    "Sure ``` is a fence", "a {", "x <function=", "trailing blanks  \n"])
def test_streamed_deltas_add_up_to_the_whole_answer(answer):
    """Cut anywhere (one character at a time, in two at every point, and at random), the
    streamed content is the whole answer's content and the calls' deltas add up to its
    calls; before the end, the text sent is a beginning of the content, so no part of a
    call's opening ever goes out as content. An answer that is content in the end after a
    `<tool_call>` block began to stream: nothing more is sent, and no "tool_calls"."""
    content, calls = parse_hermes(answer)
    for pieces in splits(answer):
        got = streamed(HermesStream(), pieces)
        sent = "".join(got.content)
        if not calls and got.all_deltas:
            assert answer.startswith("<tool_call>") and not sent
            assert (got.rest, got.last, got.called) == ("", [], False)
            continue
        assert sent + got.rest == (content or "") and (content or "").startswith(sent)
        assert got.calls() == [(c.name, c.arguments) for c in calls]
        assert got.called == bool(calls)


def test_text_that_may_open_a_call_is_held_until_it_is_known():
    stream = HermesStream()
    assert [stream.push(p) for p in ["It is", " ``", "`json\n", "{\n", '  "name"']] == \
        [("It is", []), ("", []), ("", []), ("", []), ("", [])]
    stream = HermesStream()
    assert [stream.push(p)[0] for p in ["See ``", "`python\n", "x = {", "}\n```"]] == \
        ["See", " ```python", "\nx =", " {}"]      # (a "```" may open the next block)
    assert stream.finish() == ("\n```", [], False)
    stream = HermesStream()
    assert [stream.push(p)[0] for p in ["{", '"city"', ": 1}"]] == ["", '{"city"', ": 1}"]
    assert may_open("<function=f", 0) and may_open('<function name="f"', 0)
    assert not may_open("<function=>", 0) and not may_open("```py", 0)
    assert may_open("x ```xm", 2) and not may_open("x ```xm", 1)
