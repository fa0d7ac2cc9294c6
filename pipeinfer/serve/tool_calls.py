"""Tool calls (issue 33, item 3): the request's `tools` and `tool_choice`, and the answer's
calls parsed into OpenAI's `tool_calls` (finish_reason "tool_calls"), whole or streamed.
Pure Python: the front imports it.

Two formats, as llama-server has them (which one a model gets is decided with its template,
in tool_formats.py):
- native (Qwen2.5's template, like Hermes 2 Pro's): the template renders the tools and asks
  for `<tool_call>{"name", "arguments"}</tool_call>` blocks; the answer is parsed as
  llama-server's Hermes 2 Pro parser does, which also takes the other shapes models write
  (fenced ```json blocks, a bare object, <function=...>): hermes_calls.py. Streamed: the text
  before the first call as it comes, the calls at the end of the choice.
- generic (templates without tool support): the reply is one JSON object, `{"tool_call":
  {"name", "arguments"}}` (`{"tool_calls": [...]}` with parallel_tool_calls) or
  `{"response": "..."}`. Streamed: the response's text as it comes, the calls at the end.
`tool_choice` "auto" leaves the choice to the model (the generic format's grammar allows a
call or a response); "required" and a named function force a call with a grammar; "none"
leaves the tools out.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from .errors import ApiError
from .hermes_calls import HermesStream, ToolCall, new_id, parse_hermes

OPEN, CLOSE = "<tool_call>", "</tool_call>"
NATIVE, GENERIC = "native", "generic"


@dataclass(frozen=True)
class ToolChoice:
    """What the request's `tool_choice` and `parallel_tool_calls` ask: `required` a call
    (of the tool named `function` if set, else of any), several calls or one."""
    required: bool = False
    function: str | None = None
    parallel: bool = False


def parse_tools(body: dict) -> tuple[tuple[dict, ...], ToolChoice]:
    """The request's tools, as the template gets them (400 naming `tools` if one is not a
    function with a name), and its choice (400 naming `tool_choice` if it is not "none",
    "auto", "required" or one of the tools); no tools when tool_choice is "none"."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if tools is not None and not isinstance(tools, list):
        raise ApiError(400, "'tools' must be a list", param="tools")
    tools = tuple(_checked_tool(i, tool) for i, tool in enumerate(tools or ()))
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise ApiError(400, "'parallel_tool_calls' must be true or false",
                       param="parallel_tool_calls")
    wanted = _choice(choice, [t["function"]["name"] for t in tools])
    if wanted is None:
        return (), ToolChoice()
    return tools, ToolChoice(wanted[0], wanted[1], bool(parallel))


def _checked_tool(i: int, tool: Any) -> dict:
    function = tool.get("function") if isinstance(tool, dict) else None
    if not (isinstance(tool, dict) and tool.get("type") == "function"
            and isinstance(function, dict) and isinstance(function.get("name"), str)
            and function["name"]):
        raise ApiError(400, f"'tools[{i}]' must be {{\"type\": \"function\", "
                            "\"function\": {\"name\": ...}} with a name", param="tools")
    if not isinstance(function.get("parameters", {}), dict):
        raise ApiError(400, f"'tools[{i}].function.parameters' must be an object",
                       param="tools")
    return tool


def _choice(choice: Any, names: list[str]) -> tuple[bool, str | None] | None:
    """(required, the function named) of a tool_choice; None for "none"."""
    if choice in (None, "auto"):
        return False, None
    if choice == "none":
        return None
    function = choice.get("function") if isinstance(choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    named = isinstance(choice, dict) and choice.get("type") == "function" \
        and isinstance(name, str)
    if choice != "required" and not named:
        raise ApiError(400, "'tool_choice' must be 'none', 'auto', 'required' or "
                            "{\"type\": \"function\", \"function\": {\"name\": ...}}",
                       param="tool_choice")
    if not names:
        raise ApiError(400, f"'tool_choice' {json.dumps(choice)} needs 'tools'",
                       param="tool_choice")
    if named and name not in names:
        raise ApiError(400, f"'tool_choice' names the function {json.dumps(name)}, which is "
                            f"not one of the tools ({', '.join(names)})", param="tool_choice")
    return True, (name if named else None)


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


def parse(fmt: str, text: str) -> tuple[str | None, list[ToolCall]]:
    """(content, calls) of an answer in format `fmt` (NATIVE or GENERIC)."""
    return extract_generic(text) if fmt == GENERIC else parse_hermes(text)


def stream(fmt: str) -> "HermesStream | GenericStream":
    return GenericStream() if fmt == GENERIC else HermesStream()


def extract_generic(text: str) -> tuple[str | None, list[ToolCall]]:
    """(content, calls) of a generic answer: its `tool_call` / `tool_calls`, or its
    `response` as content; an answer cut short in its response, the response so far; any
    other text as it is."""
    reply = _json(text)
    if not isinstance(reply, dict):
        partial = response_so_far(text)
        return (text if partial is None else partial[0]), []
    if isinstance(reply.get("tool_calls"), list) or "tool_call" in reply:
        found = reply.get("tool_calls") or [reply.get("tool_call")]
        calls = [_call(c) for c in found]
        return (text, []) if None in calls else (None, calls)
    if "response" in reply:
        response = reply["response"]
        return (response if isinstance(response, str)
                else json.dumps(response, indent=2, ensure_ascii=False)), []
    return text, []


_DECODER = json.JSONDecoder(strict=False)   # (the grammar lets strings hold raw newlines)
_RESPONSE = re.compile(r'\s*\{\s*"response"\s*:\s*"')


def _json(text: str) -> Any:
    try:
        return _DECODER.decode(text)
    except ValueError:
        return None


def _call(obj: Any) -> ToolCall | None:
    """The call a JSON object {"name", "arguments"} describes (its own "id" if it has
    one), None if it does not describe one."""
    if not (isinstance(obj, dict) and isinstance(obj.get("name"), str)):
        return None
    arguments = obj.get("arguments", {})
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    given = obj.get("id")
    return ToolCall(obj["name"], arguments, given if isinstance(given, str) and given
                    else new_id())


def response_so_far(text: str) -> tuple[str, bool] | None:
    """A generic answer's response text so far, and whether its string has ended; None
    while the answer is not known to be a response. Escapes not complete yet (and the first
    half of a surrogate pair) are left for later."""
    match = _RESPONSE.match(text)
    if match is None:
        return None
    body, i, closed = text[match.end():], 0, False
    while i < len(body):
        if body[i] == '"':
            closed = True
            break
        step = (6 if body[i + 1:i + 2] == "u" else 2) if body[i] == "\\" else 1
        if i + step > len(body):
            break
        i += step
    decoded = _DECODER.decode('"' + body[:i] + '"')
    if not closed and decoded and "\ud800" <= decoded[-1] <= "\udbff":
        decoded = decoded[:-1]
    return decoded, closed


class GenericStream:
    """One streamed choice of a generic answer: a response's text streams as it comes
    (decoded from its JSON string); a call is held until the end, then parsed."""

    def __init__(self):
        self.raw, self.sent = "", ""

    def push(self, text: str) -> str:
        self.raw += text
        partial = response_so_far(self.raw)
        if partial is None:
            return ""
        new, self.sent = partial[0][len(self.sent):], partial[0]
        return new

    def finish(self) -> tuple[str, list[ToolCall]]:
        """(content still to send, calls)."""
        content, calls = extract_generic(self.raw)
        if calls:
            return "", calls
        content = content or ""
        return (content[len(self.sent):] if content.startswith(self.sent) else ""), []
