"""Tool calls: the request's `tools` and `tool_choice`, and the answer's
calls parsed into OpenAI's `tool_calls` (finish_reason "tool_calls"), whole or streamed.
Pure Python: the front imports it.

Two formats, as llama-server has them (which one a model gets is decided with its template,
in tool_formats.py):
- native (Qwen2.5's template, like Hermes 2 Pro's): the template renders the tools and asks
  for `<tool_call>{"name", "arguments"}</tool_call>` blocks; the answer is parsed as
  llama-server's Hermes 2 Pro parser does, which also takes the other shapes models write
  (fenced ```json blocks, a bare object, <function=...>): hermes_calls.py. Streamed: the text
  before the first call as it comes, each `<tool_call>` block's call as it is written, a
  call in another shape (and the calls after it) whole at the end of the choice.
- generic (templates without tool support): the reply is one JSON object, `{"tool_call":
  {"name", "arguments"}}` (`{"tool_calls": [...]}` with parallel_tool_calls) or
  `{"response": "..."}`. Streamed: the response's text as it comes, each call as it is
  written.
A call streams as OpenAI streams one (call_stream.py): its first delta (index, id, type,
name) once its name is known, then the pieces of its arguments, which add up to the whole
answer's arguments. `tool_choice` "auto" leaves the choice to the model (the generic
format's grammar allows a call or a response); "required" and a named function force a call
with a grammar; "none" leaves the tools out.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from .call_stream import StreamedCall, ToolCall, call_arguments, new_id, rest_of_calls
from .errors import ApiError
from .hermes_calls import HermesStream, parse_hermes
from .json_scan import JsonScan, first_wins, string_so_far

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
    many = reply.get("tool_calls")
    if isinstance(many, list) or "tool_call" in reply:
        found = many if isinstance(many, list) and many else [reply.get("tool_call")]
        paths = [("tool_calls", k) for k in range(len(found))] if found is many \
            else [("tool_call",)]
        scan = JsonScan(0, depth=3).advance(text)
        calls = [_call(text, scan, path, obj) for path, obj in zip(paths, found)]
        return (text, []) if None in calls else (None, calls)
    if "response" in reply:
        response = reply["response"]
        return (response if isinstance(response, str)
                else json.dumps(response, indent=2, ensure_ascii=False)), []
    return text, []


# (the grammar lets strings hold raw newlines)
_DECODER = json.JSONDecoder(strict=False, object_pairs_hook=first_wins)
_RESPONSE = re.compile(r'\s*\{\s*"response"\s*:\s*"')


def _json(text: str) -> Any:
    try:
        return _DECODER.decode(text)
    except ValueError:
        return None


def _call(text: str, scan: JsonScan, path: tuple, obj: Any) -> ToolCall | None:
    """The call a JSON object {"name", "arguments"} at `path` of the scanned `text`
    describes, None if it does not describe one."""
    if not (isinstance(obj, dict) and isinstance(obj.get("name"), str) and obj["name"]):
        return None
    return ToolCall(obj["name"], call_arguments(text, scan, path, obj.get("arguments")),
                    new_id())


def response_so_far(text: str) -> tuple[str, bool] | None:
    """A generic answer's response text so far, and whether its string has ended; None
    while the answer is not known to be a response. Escapes not complete yet (and the first
    half of a surrogate pair) are left for later."""
    match = _RESPONSE.match(text)
    return None if match is None else string_so_far(text, match.end() - 1)


class GenericStream:
    """One streamed choice of a generic answer: a response's text streams as it comes
    (decoded from its JSON string), each call as it is written. If the reply does not parse
    in the end (cut short by max_tokens), the text held goes out as content if no call was
    streamed yet; if one was, the deltas sent stand and nothing more is sent (and the finish
    reason is not "tool_calls")."""

    def __init__(self):
        self.raw, self.sent = "", ""
        self._scan = JsonScan(0, depth=3)
        self._streamed: list[StreamedCall] = []

    def push(self, text: str) -> tuple[str, list[dict]]:
        """(the content to send, the calls' deltas to send) once `text` is added."""
        self.raw += text
        partial = response_so_far(self.raw)
        if partial is not None:
            new, self.sent = partial[0][len(self.sent):], partial[0]
            return new, []
        self._scan.advance(self.raw)
        deltas = []
        for k, path in enumerate(self._call_paths()):
            if k == len(self._streamed):
                self._streamed.append(StreamedCall(k))
            delta = self._streamed[k].delta(self.raw, self._scan, path)
            if delta:
                deltas.append(delta)
            if self._streamed[k].name is None:
                break    # (the next calls wait for this one's first delta)
        return "", deltas

    def _call_paths(self) -> list[tuple]:
        """The paths of the calls begun, in the reply's first key: `tool_call` or
        `tool_calls`."""
        spans = self._scan.spans
        first = next((path for path in spans if len(path) == 1), None)
        if first == ("tool_call",):
            return [first]
        if first != ("tool_calls",):
            return []
        return [p for p in spans if len(p) == 2 and p[0] == "tool_calls"
                and isinstance(p[1], int)]

    def finish(self) -> tuple[str, list[dict], bool]:
        """(content still to send, call deltas still to send, whether the answer has
        calls)."""
        content, calls = extract_generic(self.raw)
        if calls:
            return "", rest_of_calls(self._streamed, calls) or [], True
        if any(c.name is not None for c in self._streamed):
            return "", [], False
        content = content or ""
        return (content[len(self.sent):] if content.startswith(self.sent) else ""), [], False
