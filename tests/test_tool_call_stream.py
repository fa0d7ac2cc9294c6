"""Tool calls streamed while they are written (api/call_stream.py, json_scan.py): a call's
first delta (index, id, type, name) once its name is known, then the pieces of its arguments,
which add up, character for character, to the whole answer's arguments however the answer
is cut into tokens; native `<tool_call>` blocks and the generic format's calls, one or
several; what happens to a call that does not parse in the end; and a reply's chunks
(responses.py, n=2) added up by the `openai` SDK's own stream accumulator."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk

from pipeinfer.model.sampling import SamplingParams
from pipeinfer.api.requests import parse_chat
from pipeinfer.api.events import Done, Piece
from pipeinfer.api.hermes_calls import HermesStream, parse_hermes
from pipeinfer.api.json_scan import JsonScan
from pipeinfer.api.responses import Reply
from pipeinfer.api.tool_calls import GENERIC, NATIVE, GenericStream, extract_generic
from support.streamed_calls import add_up, splits, streamed

ARGS = '{"q": "caf\\u00e9 \\"x\\" \u00e9\\\\", "n": [1, 2.5e3, {"}": "]"}], "ok": true}'
BLOCK = '<tool_call>\n{"name": "search", "arguments": ' + ARGS + '}\n</tool_call>'
NATIVE_ANSWERS = [
    BLOCK,
    "Let me look that up.\n\n" + BLOCK,
    BLOCK + "\n" + BLOCK.replace("search", "fetch").replace("2.5e3", "7"),   # parallel
    '<tool_call>\n{"name": "f"}\n</tool_call>',                             # no arguments
    '<tool_call>{"name": "f", "arguments": "{\\"a\\": \\"\\u00e9\\"}"}</tool_call>',   # a string
    '<tool_call>\n{"name": "f", "arguments": 12}\n</tool_call>',
    BLOCK + "\nAnd a fenced one:\n```json\n" + '{"name": "g", "arguments": {}}' + "\n```",
    BLOCK + " between " + BLOCK,
]
GENERIC_ANSWERS = [
    '{ "tool_call": { "name": "search", "arguments": ' + ARGS + ' } }',
    '{"tool_calls": [{"name": "search", "arguments": ' + ARGS + ', "id": "call_1"},\n'
    ' {"name": "fetch", "arguments": {"url": "x"}, "id": "abcd"}]}',
    '{"tool_call": {"arguments": {"a": [1]}, "name": "f"}}',      # (the name after)
    '{"tool_call": {"name": "f"}}',
    '{"tool_call": {"name": "f", "arguments": "{\\"a\\": \\"\\ud83d\\ude00\\"}"}}',
    '{"response": "Hello \\u00e9"}',
]


def test_the_scan_finds_each_values_span_however_the_text_is_cut():
    text = ' {"a": [1, "x\\"]", {"b": null}], "c": {"d": -2.5e1}, "a": 3} tail'
    whole = JsonScan(0, depth=2).advance(text)
    assert whole.end == text.index(" tail") and not whole.broken
    assert {p: text[s:e] for p, (s, e) in whole.spans.items()} == {
        (): text[1:text.index(" tail")], ("a",): '[1, "x\\"]", {"b": null}]',
        ("a", 0): "1", ("a", 1): '"x\\"]"', ("a", 2): '{"b": null}',
        ("c",): '{"d": -2.5e1}', ("c", "d"): "-2.5e1"}    # ("a" twice: its first value)
    for pieces in splits(text, 5):
        scan, seen = JsonScan(0, depth=2), ""
        for piece in pieces:
            seen += piece
            scan.advance(seen)
            assert all(e is None or e <= len(seen) for _, e in scan.spans.values())
        assert scan.spans == whole.spans and scan.end == whole.end
    assert JsonScan(0).advance('{"a" 1}').broken and JsonScan(0).advance('{"a": }').broken


@pytest.mark.parametrize("answer", NATIVE_ANSWERS)
def test_native_calls_stream_and_add_up_to_the_whole_answers(answer):
    content, calls = parse_hermes(answer)
    assert calls
    for pieces in splits(answer):
        got = streamed(HermesStream(), pieces)
        assert got.calls() == [(c.name, c.arguments) for c in calls]
        assert "".join(got.content) + got.rest == (content or "") and got.called


@pytest.mark.parametrize("answer", GENERIC_ANSWERS)
def test_generic_calls_stream_and_add_up_to_the_whole_answers(answer):
    content, calls = extract_generic(answer)
    for pieces in splits(answer):
        got = streamed(GenericStream(), pieces)
        assert got.calls() == [(c.name, c.arguments) for c in calls]
        assert "".join(got.content) + got.rest == (content or "")
        assert got.called == bool(calls) and not got.last   # (every call streamed)


def test_each_piece_of_the_arguments_goes_out_with_the_token_that_wrote_it():
    """Pushed one character at a time: the first delta goes out with the name's closing
    quote, and from then on the arguments sent are the answer's text up to where it is
    (an escape waits for the character after its backslash), in order, nothing held."""
    start = BLOCK.index(ARGS)
    end, name_end = start + len(ARGS), BLOCK.index('"search"') + len('"search"')
    stream, sent = HermesStream(), ""
    for pos in range(1, len(BLOCK) + 1):
        _, deltas = stream.push(BLOCK[pos - 1])
        if pos == name_end:
            assert deltas and deltas[0]["function"]["name"] == "search"
        elif pos < name_end:
            assert deltas == []
        sent += "".join(d["function"]["arguments"] for d in deltas)
        want = BLOCK[start:min(max(pos, start), end)]
        escaping = (len(want) - len(want.rstrip("\\"))) % 2    # (a backslash's escape)
        assert sent == (want[:-1] if escaping else want), pos
    assert sent == ARGS and stream.finish() == ("", [], True)


def test_parallel_calls_take_the_indices_in_order_with_their_own_ids():
    for fmt_stream, answer in ((HermesStream, NATIVE_ANSWERS[2]),
                               (GenericStream, GENERIC_ANSWERS[1])):
        got = streamed(fmt_stream(), list(answer))
        calls = add_up(got.all_deltas)
        assert [name for _, name, _ in calls] == ["search", "fetch"]
        assert len({call_id for call_id, _, _ in calls}) == 2
        assert not got.last and got.called
        arguments_pushes = [k for k, deltas in enumerate(got.deltas)
                            if any("id" not in d for d in deltas)]
        assert len(arguments_pushes) > 10     # (many chunks, each a piece)


def test_other_native_shapes_come_whole_at_the_end():
    """A fenced block or a bare object: held to the end of the choice, then sent whole
    (as is any call after one)."""
    answer = NATIVE_ANSWERS[6]
    got = streamed(HermesStream(), list(answer))
    assert [d["index"] for d in got.last] == [1] and got.last[0]["function"] == {
        "name": "g", "arguments": "{}"}
    fenced = '```json\n{"name": "g", "arguments": {"a": 1}}\n```'
    got = streamed(HermesStream(), list(fenced))
    assert not any(got.deltas) and got.calls() == [("g", '{"a": 1}')]


@pytest.mark.parametrize("stream_class, answer", [
    (HermesStream, 'Hi <tool_call>\n{"name": "f", "arguments": {"a": [1, 2'),   # max_tokens
    (HermesStream, '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_cal'),
    (HermesStream, '<tool_call>{"name": "f", "arguments": {"x": NaN}}</tool_call>'),
    (HermesStream, '<tool_call>{"name": "f", "arguments": {}}</tool_call>\n'
                   '<tool_call>{"name": oops</tool_call>'),
    (GenericStream, '{"tool_call": {"name": "f", "arguments": {"a": "b'),
    (GenericStream, '{"tool_calls": [{"name": "f", "arguments": {}}, {"name": "g", "arg'),
])
def test_a_call_that_does_not_parse_after_it_began_to_stream(stream_class, answer):
    """The whole answer is content (llama.cpp's fallback); streamed, what went out stands
    (a client cannot take it back): the text before the call, the call as far as it was
    written; then nothing more, and the finish reason stays the answer's own."""
    whole_content, whole_calls = (extract_generic if stream_class is GenericStream
                                  else parse_hermes)(answer)
    assert not whole_calls
    for pieces in splits(answer, 5):
        got = streamed(stream_class(), pieces)
        calls = got.calls()
        assert calls and calls[0][0] == "f" and (got.rest, got.last, got.called) == (
            "", [], False)
        assert answer.startswith("".join(got.content))
        written = answer[answer.index('"arguments"') + len('"arguments": '):]
        assert written.startswith(calls[0][1])


@pytest.mark.parametrize("stream_class, answer", [
    (HermesStream, '<tool_call>{"name": 3, "arguments": {}}</tool_call>'),
    (HermesStream, '<tool_call>{"name": "", "arguments": {}}</tool_call>'),
    (GenericStream, '{"tool_call": {"name": 3, "arguments": {}}}'),
])
def test_a_call_that_never_opened_falls_back_to_content(stream_class, answer):
    for pieces in splits(answer, 5):
        got = streamed(stream_class(), pieces)
        assert not got.all_deltas and not got.called
        assert "".join(got.content) + got.rest == answer


def _reply(fmt: str, n: int, stream: bool) -> Reply:
    tools = [{"type": "function", "function": {"name": name, "parameters": {}}}
             for name in ("search", "fetch", "f")]
    ask = parse_chat({"messages": [{"role": "user", "content": "?"}], "tools": tools,
                      "n": n, "stream": stream}, SamplingParams())
    return Reply(replace(ask, tool_format=fmt), "m", 1)


@pytest.mark.parametrize("fmt, answers", [(NATIVE, NATIVE_ANSWERS[1:3]),
                                          (GENERIC, GENERIC_ANSWERS[:2])])
def test_the_openai_sdk_adds_the_chunks_up_to_the_whole_response(fmt, answers):
    """Two choices streamed token by token, interleaved, each with its own stream state;
    the SDK's accumulator (what client.chat.completions.stream() uses) gives the calls of
    the whole response to the same text, and sees the arguments in many deltas."""
    whole, live = _reply(fmt, 2, False), _reply(fmt, 2, True)
    state = ChatCompletionStreamState()
    events = [e for chunk in live.opening() for e in state.handle_chunk(
        ChatCompletionChunk.model_validate(chunk))]
    done = Done("stop", 5, 10)
    for k in range(max(len(a) for a in answers)):
        for index, answer in enumerate(answers):
            if k < len(answer):
                piece = Piece(answer[k], 1)
                whole.add(index, piece)
                chunk = live.chunk(index, piece)
                if chunk is not None:
                    events += state.handle_chunk(ChatCompletionChunk.model_validate(chunk))
    for index in range(2):
        whole.end(index, done)
        live.end(index, done)
        for chunk in live.finished(index):
            events += state.handle_chunk(ChatCompletionChunk.model_validate(chunk))
    final, want = state.get_final_completion(), whole.whole()
    for choice, wanted in zip(final.choices, want["choices"]):
        assert choice.finish_reason == wanted["finish_reason"] == "tool_calls"
        assert choice.message.content == wanted["message"]["content"] or (
            not choice.message.content and wanted["message"]["content"] is None)
        assert [(c.function.name, c.function.arguments) for c in choice.message.tool_calls] \
            == [(c["function"]["name"], c["function"]["arguments"])
                for c in wanted["message"]["tool_calls"]]
        assert all(json.loads(c.function.arguments) for c in choice.message.tool_calls)
    pieces = [e for e in events if e.type == "tool_calls.function.arguments.delta"
              and e.arguments_delta]
    assert len(pieces) > 20
