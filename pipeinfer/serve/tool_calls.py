"""Tool calls through the model's own chat template (issue 33, item 3, without constrained
decoding): the request's `tools` are rendered by the template (Qwen2.5's, like Hermes 2 Pro
templates, lists them in the system message and asks for `<tool_call>{json}</tool_call>`),
the history's assistant `tool_calls` and `tool` messages too, and the model's
`<tool_call>` blocks come back parsed into `tool_calls` with finish_reason "tool_calls",
streamed as deltas at the end of the choice (its text before the first block streams as
content). `tool_choice` "auto" and "none" only: "required" and a named function need a
grammar to force the call, and a template without tool support needs llama-server's generic
format, constrained too; those are a 400.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Any, Collection

from .errors import ApiError
from .stop_text import StopText

OPEN, CLOSE = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str     # JSON text, as OpenAI's API carries it
    id: str

    def json(self, index: int | None = None) -> dict:
        out = {"id": self.id, "type": "function",
               "function": {"name": self.name, "arguments": self.arguments}}
        return out if index is None else dict(out, index=index)


def parse_tools(body: dict) -> tuple[dict, ...]:
    """The request's tools, as the template gets them (400 naming `tools` if one is not a
    function with a name); none when tool_choice is "none"."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if choice not in (None, "none", "auto"):
        raise ApiError(400, f"'tool_choice' {json.dumps(choice)}: forcing a tool call needs "
                            "constrained decoding, which this server does not do yet (use "
                            "'auto')", param="tool_choice")
    if tools is None or choice == "none":
        return ()
    if not isinstance(tools, list):
        raise ApiError(400, "'tools' must be a list", param="tools")
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not (isinstance(tool, dict) and tool.get("type") == "function"
                and isinstance(function, dict) and isinstance(function.get("name"), str)
                and function["name"]):
            raise ApiError(400, f"'tools[{i}]' must be {{\"type\": \"function\", "
                                "\"function\": {\"name\": ...}} with a name", param="tools")
        if not isinstance(function.get("parameters", {}), dict):
            raise ApiError(400, f"'tools[{i}].function.parameters' must be an object",
                           param="tools")
    return tuple(tools)


def history_calls(where: str, calls: Any) -> list[dict]:
    """An assistant message's `tool_calls` for the template, their arguments as objects
    (llama-server parses them: templates write them with tojson)."""
    if not isinstance(calls, list):
        raise ApiError(400, f"{where}.tool_calls must be a list", param="messages")
    out = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not (isinstance(function, dict) and isinstance(function.get("name"), str)):
            raise ApiError(400, f"{where}.tool_calls: each needs a function with a name",
                           param="messages")
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except ValueError:
                raise ApiError(400, f"{where}.tool_calls: arguments of "
                                    f"{function['name']} are not JSON", param="messages") from None
        out.append({"id": call.get("id", ""), "type": "function",
                    "function": {"name": function["name"], "arguments": arguments}})
    return out


def extract(text: str, names: Collection[str] = ()) -> tuple[str | None, list[ToolCall]]:
    """(content, calls) of an answer: the text before the first <tool_call> block and the
    blocks' calls; the whole text as content, no calls, if a block does not parse. An answer
    that is nothing but such a JSON object naming one of the tools (`names`) is a call too:
    small models often leave the tags out."""
    if OPEN not in text:
        call = _call(text.strip()) if text.lstrip().startswith("{") else None
        return (None, [call]) if call is not None and call.name in names else (text, [])
    head, _, rest = text.partition(OPEN)
    calls = [_call(block.split(CLOSE, 1)[0].strip()) for block in rest.split(OPEN)]
    if None in calls:
        return text, []
    return (head.strip() or None), calls


def _call(body: str) -> ToolCall | None:
    """The call a JSON object {"name", "arguments"} describes (None if it does not)."""
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if not (isinstance(obj, dict) and isinstance(obj.get("name"), str)):
        return None
    arguments = obj.get("arguments", {})
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return ToolCall(obj["name"], arguments, f"call_{secrets.token_hex(8)}")


class ToolStream:
    """One streamed choice of a request with tools: text before a <tool_call> streams as
    content; from there on it is held until the end, when the calls are parsed. An answer
    that begins with "{" is held whole (it may be a call without the tags)."""

    def __init__(self, names: Collection[str] = ()):
        self.names, self.raw, self._cut = names, "", StopText([OPEN])
        self._streaming = False   # the beginning is not a bare JSON object: text flows

    def push(self, text: str) -> str:
        self.raw += text
        if not self._streaming:
            if self.raw.lstrip()[:1] in ("", "{"):
                return ""    # nothing but blanks yet, or a bare JSON object so far
            self._streaming, text = True, self.raw
        return self._cut.push(text)

    def finish(self) -> tuple[str, list[ToolCall]]:
        """(content still to send, calls)."""
        content, calls = extract(self.raw, self.names)
        if calls:
            return "", calls
        return self.raw[len(self._cut.text):], []
