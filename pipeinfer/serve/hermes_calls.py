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

Differences, deliberate: the content of an answer with calls loses its trailing blanks (and
is null if nothing else is left), so a streamed answer never sends the blanks before a call;
a call without "arguments" gets "{}" (llama.cpp: "", which an OpenAI client cannot parse); a
call whose name is not a string is no call (llama.cpp throws).
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass

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


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str     # JSON text, as OpenAI's API carries it
    id: str

    def json(self, index: int | None = None) -> dict:
        out = {"id": self.id, "type": "function",
               "function": {"name": self.name, "arguments": self.arguments}}
        return out if index is None else dict(out, index=index)


def new_id() -> str:
    return f"call_{secrets.token_hex(8)}"


class _NotCalls(ValueError):
    """The answer is content: a call began but does not parse or is not closed."""


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")     # (nlohmann's parser refuses NaN, Infinity)


_DECODER = json.JSONDecoder(parse_constant=_no_constant)


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
        obj, end = _json_at(text, match.start(3))
        name = obj.get("name")
        if not isinstance(name, str) or not name:
            raise _NotCalls("a call's name must be a string")
        arguments = obj.get("arguments", {})
        given = obj.get("id")
        call = ToolCall(name, arguments if isinstance(arguments, str) else _dump(arguments),
                        given if isinstance(given, str) and given else new_id())
        tag = match.group(2)
        close = "</" + tag[1:] if tag else ""
    else:
        arguments, end = _json_at(text, match.end())
        call = ToolCall(match.group(4) or match.group(5), _dump(arguments), new_id())
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


def _dump(value) -> str:
    """JSON text as llama.cpp's nlohmann::json dump() writes it (compact, ASCII)."""
    return json.dumps(value, ensure_ascii=True, separators=(",", ":"))


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
    """One streamed choice of a native answer: its text streams as content up to where a
    call may begin (text that may open one is held until it is known); from the first call
    on it is held to the end of the choice, when the whole answer is parsed: the calls, or
    (if they do not parse) the rest as content."""

    def __init__(self):
        self.raw, self.sent = "", 0      # the answer so far; how much of it was sent
        self._calling = False            # a call has opened: nothing more streams

    def push(self, text: str) -> str:
        self.raw += text
        if self._calling:
            return ""
        match = _OPEN.search(self.raw, self.sent)
        self._calling = match is not None
        hold = match.start() if match else len(self.raw)
        hold = next((p for p in range(self.sent, hold) if may_open(self.raw, p)), hold)
        while hold > self.sent and self.raw[hold - 1] in _BLANKS:
            hold -= 1    # (blanks before a call are not content)
        out, self.sent = self.raw[self.sent:hold], hold
        return out

    def finish(self) -> tuple[str, list[ToolCall]]:
        """(content still to send, calls)."""
        content, calls = parse_hermes(self.raw)
        if not calls:
            return self.raw[self.sent:], []
        return (content or "")[self.sent:], calls
