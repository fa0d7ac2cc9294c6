"""A tool call, whole or streamed as OpenAI streams one: the call's first delta carries its
index, id, type, name (and its arguments so far, most often ""), the next ones the pieces of
its arguments as they are written. Pure Python: the front imports it.

A call's arguments are the model's own text of its "arguments" value (JSON by construction
when the call parsed, as OpenAI returns them), or the string's text if that value is a
string, or "{}" if the call has none; whole and streamed alike, so the streamed pieces of a
call add up to the whole answer's arguments, character for character. A call's id is the
server's: an "id" the model writes (the generic format's grammar asks for one after the
arguments) comes too late for a call's first delta.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from .json_scan import JsonScan, string_so_far


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


def arguments_text(text: str, start: int, end: int, value) -> str:
    """A call's arguments whose value `value` is written at text[start:end]."""
    return value if isinstance(value, str) else text[start:end]


def call_arguments(text: str, scan: JsonScan, call: tuple, value) -> str:
    """The arguments of the whole call at path `call` of a scanned text, `value` its
    "arguments" as parsed (None if it has none)."""
    span = scan.spans.get(call + ("arguments",))
    return "{}" if span is None else arguments_text(text, span[0], span[1], value)


def name_so_far(text: str, scan: JsonScan, call: tuple) -> str | None:
    """The name of the call at path `call`, once its string is whole (None before, or if
    it is not a string, or empty)."""
    span = scan.spans.get(call + ("name",))
    if span is None or span[1] is None or text[span[0]] != '"':
        return None
    decoded = string_so_far(text, span[0])
    return decoded[0] if decoded and decoded[1] and decoded[0] else None


def arguments_so_far(text: str, scan: JsonScan, call: tuple) -> str | None:
    """The arguments of the call at path `call` as far as they are written: always a
    beginning of call_arguments' answer once the call is whole (None: nothing known)."""
    span = scan.spans.get(call + ("arguments",))
    if span is None:
        whole = scan.spans.get(call)
        return "{}" if whole is not None and whole[1] is not None else ""
    start, end = span
    if text[start] == '"':
        decoded = string_so_far(text, start)
        return None if decoded is None else decoded[0]
    return text[start:scan.pos if end is None else end]


class StreamedCall:
    """Call `index` of a choice going out as it is written."""

    def __init__(self, index: int):
        self.index, self.id = index, new_id()
        self.name: str | None = None     # sent in the call's first delta
        self.arguments = ""              # sent so far

    def delta(self, text: str, scan: JsonScan, call: tuple) -> dict | None:
        """The call's delta for what `scan` found of it since the last one: its first
        (once its name is known), then the next piece of its arguments; None if there is
        nothing new to send."""
        opening = self.name is None
        if opening:
            self.name = name_so_far(text, scan, call)
            if self.name is None:
                return None
        arguments = arguments_so_far(text, scan, call)
        piece = ""
        if arguments is not None and arguments.startswith(self.arguments):
            piece, self.arguments = arguments[len(self.arguments):], arguments
        if opening:
            return {"index": self.index, "id": self.id, "type": "function",
                    "function": {"name": self.name, "arguments": piece}}
        return {"index": self.index, "function": {"arguments": piece}} if piece else None


def rest_of_calls(streamed: list[StreamedCall], calls: list[ToolCall]) -> list[dict] | None:
    """The deltas that complete a choice's `calls` (the whole answer's) after the calls
    `streamed`: the rest of each streamed call's arguments (most often nothing), then each
    call not streamed, whole. None if the calls do not begin with what was streamed (a
    call that does not parse in the end): nothing can take back what was sent."""
    opened = [s for s in streamed if s.name is not None]
    if len(opened) > len(calls) or any(
            s.name != c.name or not c.arguments.startswith(s.arguments)
            for s, c in zip(opened, calls)):
        return None
    out = []
    for k, call in enumerate(calls):
        if k >= len(opened):
            out.append(call.json(k))
        elif len(call.arguments) > len(opened[k].arguments):
            out.append({"index": k, "function": {
                "arguments": call.arguments[len(opened[k].arguments):]}})
    return out
