"""JSON text read as it is written, for tool calls streamed while the model writes them
(tool_calls.py, hermes_calls.py): where each value of the text begins and ends, and a JSON
string's text decoded so far. Pure Python: the front imports it.

The scan finds structure only (strings and their escapes, nesting, separators); it does not
check that the text is JSON: a parser decides that once the text is whole. What it finds in
a beginning of a text is what it finds there in the whole text, so the pieces a stream sends
from it add up to what the whole answer gives.
"""

from __future__ import annotations

import json
import re

_JSON_BLANKS = " \t\n\r"
_STRING_STOP = re.compile(r'["\\]')
_SCALAR_END = re.compile(r"[ \t\n\r,:\]}]")


def first_wins(pairs: list) -> dict:
    """A JSON object's keys and values, a key written twice with its first value (as the
    scan takes it): the object_pairs_hook of the parsers that check what was scanned."""
    out: dict = {}
    for key, value in pairs:
        out.setdefault(key, value)
    return out


_DECODER = json.JSONDecoder(strict=False)

# what an open object or array expects next
_KEY, _COLON, _VALUE, _NEXT = "key", "colon", "value", "next"


class _Open:
    """An object or array being scanned: where it began, its current key or index, what
    it expects next."""

    def __init__(self, kind: str, start: int):
        self.kind, self.start = kind, start
        self.at: str | int | None = 0 if kind == "[" else None
        self.expects = _VALUE if kind == "[" else _KEY


class JsonScan:
    """Where the values of one JSON text (its root value beginning at `start`, after blanks)
    begin and end, found as the text grows: `spans` maps each value's path (the keys and
    indices from the root, at most `depth` of them) to [start, end], end None while the value
    goes on (a key written twice: its first value). `end` is where the root value ends, once
    it has; `broken` once the text cannot be JSON (the scan stops)."""

    def __init__(self, start: int = 0, depth: int = 1):
        self.pos, self.depth = start, depth
        self.spans: dict[tuple, list] = {}
        self.end: int | None = None
        self.broken = False
        self._open: list[_Open] = []
        self._string: tuple[int, bool] | None = None   # (its quote, whether a key)
        self._scalar: int | None = None                # where a number or literal began

    @property
    def done(self) -> bool:
        return self.end is not None or self.broken

    def advance(self, text: str) -> "JsonScan":
        """Scans `text` (the same text, grown) from where the last call stopped."""
        while self.pos < len(text) and not self.done:
            if self._string is not None:
                if not self._in_string(text):
                    break        # (an escape's character comes with more text)
            elif self._scalar is not None:
                found = _SCALAR_END.search(text, self.pos)
                if found is None:
                    self.pos = len(text)
                else:
                    self._ended(self._scalar, found.start())
                    self._scalar, self.pos = None, found.start()
            else:
                self._at(text, text[self.pos])
        return self

    def _in_string(self, text: str) -> bool:
        """Scans on in a string: False if it waits for more text."""
        found = _STRING_STOP.search(text, self.pos)
        if found is None:
            self.pos = len(text)
        elif found.group() == "\\":
            if found.start() + 1 >= len(text):
                self.pos = found.start()
                return False
            self.pos = found.start() + 2
        else:
            quote, is_key = self._string
            self._string, self.pos = None, found.end()
            if is_key:
                self._keyed(text[quote:self.pos])
            else:
                self._ended(quote, self.pos)
        return True

    def _at(self, text: str, char: str) -> None:
        """One character outside strings and scalars."""
        self.pos += 1
        if char in _JSON_BLANKS:
            return
        top = self._open[-1] if self._open else None
        expects = _VALUE if top is None else top.expects
        if expects == _VALUE and not (top and top.kind == "[" and char == "]"):
            self._begin(self.pos - 1, char)
        elif expects == _KEY and char == '"':
            self._string = (self.pos - 1, True)
        elif expects == _COLON and char == ":":
            top.expects = _VALUE
        elif expects == _NEXT and char == ",":
            top.expects = _KEY if top.kind == "{" else _VALUE
            if top.kind == "[":
                top.at += 1
        elif char == ("}" if top.kind == "{" else "]") and expects in (_KEY, _NEXT, _VALUE):
            self._open.pop()
            self._ended(top.start, self.pos)
        else:
            self.broken = True

    def _path(self) -> tuple:
        return tuple(o.at for o in self._open)

    def _begin(self, start: int, char: str) -> None:
        path = self._path()
        if len(path) <= self.depth and path not in self.spans:
            self.spans[path] = [start, None]
        if char in "{[":
            self._open.append(_Open(char, start))
        elif char == '"':
            self._string = (start, False)
        elif char in ",:]}":
            self.broken = True
        else:
            self._scalar = start

    def _keyed(self, key_text: str) -> None:
        try:
            key = _DECODER.decode(key_text)
        except ValueError:
            key = key_text
        self._open[-1].at, self._open[-1].expects = key, _COLON

    def _ended(self, start: int, end: int) -> None:
        """The value that began at `start` ends at `end`."""
        span = self.spans.get(self._path())
        if span is not None and span[0] == start:
            span[1] = end
        if self._open:
            self._open[-1].expects = _NEXT
        else:
            self.end = end


def string_so_far(text: str, quote: int) -> tuple[str, bool] | None:
    """The JSON string whose quote is at `quote`, decoded as far as it is written, and
    whether it has ended; escapes not complete yet (and the first half of a surrogate pair)
    are left for later. None if it does not decode (a bad escape)."""
    i, end = quote + 1, len(text)
    closed = False
    while i < end:
        if text[i] == '"':
            closed = True
            break
        step = (6 if text[i + 1:i + 2] == "u" else 2) if text[i] == "\\" else 1
        if i + step > end:
            break
        i += step
    try:
        decoded = _DECODER.decode(text[quote:i] + '"')
    except ValueError:
        return None
    if not closed and decoded and "\ud800" <= decoded[-1] <= "\udbff":
        decoded = decoded[:-1]
    return decoded, closed
