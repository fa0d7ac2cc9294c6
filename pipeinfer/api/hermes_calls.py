"""Tool calls in a native-format answer (Qwen2.5's and Hermes 2 Pro's templates), parsed as
llama-server parses them (llama.cpp common/chat-parser.cpp, common_chat_parse_hermes_2_pro),
whole or streamed. Pure Python: the front imports it.

A call opens (llama.cpp's open regex, searched left to right) with one of
- a JSON object whose first key is "name" (`{"name": ..., "arguments": {...}}`), bare or
  behind one of the tags <tool_call>, <function_call>, <tool>, <tools>, <response>, <json>,
  <xml>, <JSON>, the lot optionally inside a fenced block (```` ``` ````, ```` ```json ````
  or ```` ```xml ````, then a newline);
- `<function=NAME>` or `<function name="NAME">`, followed by the arguments' JSON object.
The tag, if any, must be closed (`</tool_call>`, ..., `</function>`) and the fence too
(```` ``` ````), blanks allowed between. Text before, between and after the calls is the
content. Any function name is a call (llama.cpp does not check it against the tools). If a
call's JSON does not parse, is cut short, or its tag or fence is not closed, the whole answer
is content and there are no calls (llama.cpp's content-only fallback).

Streamed, `<tool_call>` blocks (the shape the grammar keeps to, lazy with tool_choice
"auto") go out as they are written, call by call (call_stream.py); a call in any other
shape, and every call after it, is sent whole at the end of the choice.

Differences, deliberate: the content of an answer with calls loses its trailing blanks (and
is null if nothing else is left), so a streamed answer never sends the blanks before a call;
a call's arguments are the model's text of them (llama.cpp dumps them again, compact:
call_stream.py), "{}" if it has none (llama.cpp: "", which an OpenAI client cannot parse); a
call's id is the server's (llama.cpp keeps an "id" the model writes); a call whose name is
not a string, or is empty, is no call (llama.cpp throws).
"""

from __future__ import annotations

import json
import re

from .call_stream import (StreamedCall, ToolCall, arguments_text, call_arguments, new_id,
                          rest_of_calls)
from .json_scan import JsonScan, first_wins

_BLANKS = " \t\n\v\f\r"     # (std::isspace: what llama.cpp's consume_spaces skips)
_WS = "[ \\t\\n\\v\\f\\r]*"
TAGS = ("<tool_call>", "<function_call>", "<tool>", "<tools>", "<response>", "<json>",
        "<xml>", "<JSON>")
_OPEN = re.compile(
    "(?:(```(?:xml|json)?\\n" + _WS + ")?"                       # 1: the fence
    "(" + "|".join(re.escape(t) for t in TAGS) + ")?"              # 2: the tag
    "(" + _WS + '\\{' + _WS + '"name")'                              # 3: a named call
    ")"
    '|<function=([^>]+)>'                                            # 4: its function
    '|<function name="([^"]+)">')                                    # 5: the same


class _NotCalls(ValueError):
    """The answer is content: a call began but does not parse or is not closed."""


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")     # (nlohmann's parser refuses NaN, Infinity)


_DECODER = json.JSONDecoder(parse_constant=_no_constant, object_pairs_hook=first_wins)


def parse_hermes(text: str) -> tuple[str | None, list[ToolCall]]:
    """(content, calls) of a native answer, as llama-server's Hermes 2 Pro parser gives
    them; the whole text as content and no calls if a call does not parse."""
    content, calls, pos = [], [], 0
    try:
        while (match := _OPEN.search(text, pos)) is not None:
            content.append(text[pos:match.start()])
            call, pos = _call_at(text, match)
            calls.append(call)
    except _NotCalls:
        return text, []
    if not calls:
        return text, []
    content.append(text[pos:])
    return "".join(content).rstrip(_BLANKS) or None, calls


def _call_at(text: str, match: re.Match) -> tuple[ToolCall, int]:
    """The call `match` opens, and where the text after it (and its closing) begins."""
    if match.group(3) is not None:
        start = _skip_blanks(text, match.start(3))
        obj, end = _json_at(text, start)
        name = obj.get("name")
        if not isinstance(name, str) or not name:
            raise _NotCalls("a call's name must be a string")
        scan = JsonScan(start, depth=1).advance(text)
        call = ToolCall(name, call_arguments(text, scan, (), obj.get("arguments")), new_id())
        tag = match.group(2)
        close = "</" + tag[1:] if tag else ""
    else:
        start = _skip_blanks(text, match.end())
        arguments, end = _json_at(text, start)
        call = ToolCall(match.group(4) or match.group(5),
                        arguments_text(text, start, end, arguments), new_id())
        close = "</function>"
    end = _closed(text, end, close)
    if match.group(1):
        end = _closed(text, end, "```")
    return call, end


def _json_at(text: str, pos: int):
    """The JSON value at `pos` (after blanks) and where it ends."""
    try:
        return _DECODER.raw_decode(text, _skip_blanks(text, pos))
    except ValueError as err:
        raise _NotCalls(str(err)) from None


def _closed(text: str, pos: int, close: str) -> int:
    """Past blanks, `close` and blanks from `pos` (_NotCalls if `close` is not there)."""
    pos = _skip_blanks(text, pos)
    if not text.startswith(close, pos):
        raise _NotCalls(f"expected {close}")
    return _skip_blanks(text, pos + len(close))


def _skip_blanks(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in _BLANKS:
        pos += 1
    return pos


# --- streaming ------------------------------------------------------------------------------
# A prefix of the open regex's first alternative, as a sequence of elements: a tuple of the
# literals that may come there ("" if it may be left out), or _SPACES for blanks.
_SPACES = None
_NAMED = (TAGS + ("",), _SPACES, ("{",), _SPACES, ('"name"',))
_FENCED = (("```",), ("xml", "json", ""), ("\n",), _SPACES) + _NAMED


def may_open(text: str, pos: int) -> bool:
    """Whether text[pos:] is the beginning of a call's opening (or one whole): more text
    may make it one, so a stream holds it back."""
    return (_may_follow(text, pos, _NAMED) or _may_follow(text, pos, _FENCED)
            or _may_name(text, pos, "<function=", ">")
            or _may_name(text, pos, '<function name="', '">'))


def _may_follow(text: str, pos: int, elements: tuple) -> bool:
    if pos >= len(text):
        return True
    if not elements:
        return False
    head, rest = elements[0], elements[1:]
    if head is _SPACES:
        return _may_follow(text, _skip_blanks(text, pos), rest)
    for literal in head:
        if text.startswith(literal, pos):
            if _may_follow(text, pos + len(literal), rest):
                return True
        elif literal.startswith(text[pos:]):
            return True
    return False


def _may_name(text: str, pos: int, opening: str, closing: str) -> bool:
    """Whether text[pos:] begins `opening NAME closing` (NAME: one or more characters but
    the closing's first)."""
    rest = text[pos:]
    if len(rest) <= len(opening):
        return opening.startswith(rest)
    if not rest.startswith(opening):
        return False
    name_end = rest.find(closing[0], len(opening))
    return name_end < 0 or (name_end > len(opening)
                            and closing.startswith(rest[name_end:]))


class HermesStream:
    """One streamed choice of a native answer. Its text streams as content up to where a
    call may begin (text that may open one is held until it is known); from the first call
    on the content is held to the end of the choice. A `<tool_call>` block streams as it is
    written: its call's first delta once the name is known, then its arguments; a call in
    another shape, and every call after it, is sent whole at the end, when the whole answer
    is parsed. If it does not parse then (a call cut short by max_tokens, a tag not closed),
    the text held goes out as content if no call was streamed yet; if one was, the deltas
    sent stand and nothing more is sent (and the finish reason is not "tool_calls")."""

    def __init__(self):
        self.raw, self.sent = "", 0      # the answer so far; how much of it was sent
        self._calling = False            # a call has opened: no more content streams
        self._next: int | None = 0       # where the next call to stream is looked for
        #                                  (None: no more streaming, the rest at the end)
        self._scan: JsonScan | None = None         # the <tool_call> block streaming
        self._streamed: list[StreamedCall] = []

    def push(self, text: str) -> tuple[str, list[dict]]:
        """(the content to send, the calls' deltas to send) once `text` is added."""
        self.raw += text
        content = "" if self._calling else self._content()
        return content, (self._call_deltas() if self._calling else [])

    def _content(self) -> str:
        match = _OPEN.search(self.raw, self.sent)
        if match is not None:
            self._calling, self._next = True, match.start()
        hold = match.start() if match else len(self.raw)
        hold = next((p for p in range(self.sent, hold) if may_open(self.raw, p)), hold)
        while hold > self.sent and self.raw[hold - 1] in _BLANKS:
            hold -= 1    # (blanks before a call are not content)
        out, self.sent = self.raw[self.sent:hold], hold
        return out

    def _call_deltas(self) -> list[dict]:
        deltas = []
        while self._next is not None and (self._scan is not None or self._open_next()):
            call = self._streamed[-1]
            delta = call.delta(self.raw, self._scan.advance(self.raw), ())
            if delta:
                deltas.append(delta)
            if not self._block_closed(call):
                break
        return deltas

    def _open_next(self) -> bool:
        """Whether the next call opens a `<tool_call>` block, to stream (another shape stops
        the streaming: it and the calls after it go whole at the end)."""
        match = _OPEN.search(self.raw, self._next)
        if match is None:
            return False
        if match.group(1) or match.group(2) != TAGS[0]:
            self._next = None
            return False
        self._scan = JsonScan(_skip_blanks(self.raw, match.start(3)), depth=1)
        self._streamed.append(StreamedCall(len(self._streamed)))
        return True

    def _block_closed(self, call: StreamedCall) -> bool:
        """Whether the block streaming is closed (the next call is looked for after it);
        the streaming stops if the block cannot be a call."""
        scan, close = self._scan, "</tool_call>"
        if scan.broken or (scan.end is not None and call.name is None):
            self._next = None
        if scan.end is None or self._next is None:
            return False
        pos = _skip_blanks(self.raw, scan.end)
        if self.raw.startswith(close, pos):
            self._next, self._scan = pos + len(close), None
            return True
        if not close.startswith(self.raw[pos:]):
            self._next = None
        return False

    def finish(self) -> tuple[str, list[dict], bool]:
        """(content still to send, call deltas still to send, whether the answer has
        calls)."""
        content, calls = parse_hermes(self.raw)
        if not calls:
            if any(c.name is not None for c in self._streamed):
                return "", [], False
            return self.raw[self.sent:], [], False
        rest = rest_of_calls(self._streamed, calls)
        if rest is None:
            return "", [], True
        return (content or "")[self.sent:], rest, True
