"""How a model is asked for tool calls, decided from its chat template as llama-server
decides it (its common/chat.cpp and minja's chat_template), in the job's process (it needs
the template and llama.cpp's JSON-schema converter):

- What a template supports is found by rendering probes (minja's capabilities): it renders
  tools if a dummy tool's name appears in its text, an assistant's tool calls if a dummy
  call's arguments do, tool answers if a dummy answer does.
- A template that renders tools and writes `<tool_call>` blocks (Qwen2.5, Hermes 2 Pro) gets
  the native format; every other template the generic one (tool_calls.py): a system message
  asks for JSON with `tool_call` or `response`, and the reply is constrained by a grammar so
  it is one of those (only a call with tool_choice "required" or a named function).
- A template that does not render tools gets them described in the system message, with an
  example call as its own rendering of a call shows it; one that does not render tool calls
  or tool answers gets them as JSON text in the assistant's / a user's message (minja's
  polyfills).
- tool_choice "required" or a named function constrains the native format too: the answer
  is `<tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>` with the arguments valid
  under the tool's `parameters` schema (with parallel_tool_calls, several such blocks).
- tool_choice "auto" with the native format gets the same grammar, lazy (llama-server's
  `grammar_lazy`): the answer is free text until the model writes `<tool_call>`, and from
  that token on it keeps to the grammar, so a call the model begins always parses. The
  trigger is the `<tool_call>` token (Qwen2.5's and Hermes 2 Pro's vocabularies have it as
  one added token; a vocabulary without it leaves "auto" free, prepare.py). llama-server
  also triggers on a text pattern (a bare `{"name": "<tool>"` at the start, and the
  `<function=...>` forms, which its grammar also allows); not here: when a pattern
  matches, llama.cpp replays the text from the match into the grammar, and a token the
  grammar refuses then aborts the process (llama_grammar_accept_token throws across the C
  API), which a token trigger cannot cause: its own text is the grammar's first.

Grammars come from llama-cpp-python's port of llama.cpp's JSON-schema converter, the one
`response_format` uses (model/grammar.py); each tool's `$ref`s are resolved within its own
parameters.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

from llama_cpp.llama_grammar import SchemaConverter

from ..model.chat_template import ChatTemplate, ChatTemplateError
from ..model.grammar import GrammarError
from ..api.tool_calls import GENERIC, NATIVE, OPEN, ToolChoice

GENERIC_SYSTEM = ("Respond in JSON format, either with `tool_call` (a request to call tools) "
                  "or with `response` reply to the user's request")
TOOLS_SYSTEM = "You can call any of the following tools to satisfy the user's requests: "

_PROBE_USER = {"role": "user", "content": "<User Needle>"}
_PROBE_TOOL = {"name": "some_tool", "type": "function", "function": {
    "name": "some_tool", "description": "Some tool.", "parameters": {
        "type": "object", "properties": {"arg": {"type": "string",
                                                 "description": "Some argument."}},
        "required": ["arg"]}}}
_PROBE_ARGS = {"argument_needle": "print('Hello, World!')"}


@dataclass(frozen=True)
class Caps:
    """What a chat template renders (minja's chat_template_caps, the part used here)."""
    tools: bool
    tool_calls: bool
    tool_responses: bool
    call_example: str = ""   # a call as the template shows it (templates without tools)


def _calls_message(name: str, arguments, content=None) -> dict:
    return {"role": "assistant", "content": content, "tool_calls": [
        {"id": "call_1___", "type": "function",
         "function": {"name": name, "arguments": arguments}}]}


def _raw(template: ChatTemplate, messages: list[dict], **context) -> str:
    """The template's text, "" where it refuses or fails (a probe's answer)."""
    try:
        return template.render(messages, add_generation_prompt=False, **context)
    except ChatTemplateError:
        return ""


@lru_cache(maxsize=8)
def caps(template: ChatTemplate) -> Caps:
    renders_args = ('"argument_needle":', "'argument_needle':")
    tools = "some_tool" in _raw(template, [_PROBE_USER], tools=[_PROBE_TOOL])
    call_text = _raw(template, [_PROBE_USER, _calls_message("ipython", _PROBE_ARGS)]) + \
        _raw(template, [_PROBE_USER, _calls_message("ipython", json.dumps(_PROBE_ARGS))])
    tool_calls = any(mark in call_text for mark in renders_args)
    answer = {"role": "tool", "name": "test_tool1", "content": "Some response!",
              "tool_call_id": "call_911_"}
    responses = tool_calls and "Some response!" in _raw(
        template, [_PROBE_USER, _calls_message("test_tool1", _PROBE_ARGS), answer])
    found = Caps(tools, tool_calls, responses)
    if tools:
        return found
    return Caps(tools, tool_calls, responses, _call_example(template, found))


def _call_example(template: ChatTemplate, found: Caps) -> str:
    """A call as the template renders it (history polyfilled): its text after the prompt
    that asks for the assistant's turn, less the end-of-turn token (minja's tool call
    example)."""
    user = {"role": "user", "content": "Hey"}
    call = _calls_message("tool_name", {"arg1": "some_value"})
    try:
        prefix = template.render(_history(found, [user]), add_generation_prompt=True)
        full = template.render(_history(found, [user, call]), add_generation_prompt=False)
    except ChatTemplateError:
        return ""
    eos = template.eos_token
    last = full.rfind(eos) if eos else -1
    if last >= 0 and (last == len(prefix) - len(eos)
                      or (full.endswith("\n") and last == len(full) - len(eos) - 1)):
        full = full[:last]
    common = 0
    for i, (a, b) in enumerate(zip(prefix, full)):
        if a != b:
            break
        if a != "<":    # (minja's: a special token's "<" may begin where they diverge)
            common = i + 1
    example = full[common:]
    return example if "tool_name" in example or "some_value" in example else ""


def tool_format(template: ChatTemplate) -> str:
    """NATIVE for a template that renders tools and asks for <tool_call> blocks, GENERIC
    for every other."""
    return NATIVE if caps(template).tools and OPEN in template.source else GENERIC


def conversation(template: ChatTemplate, messages: Sequence[dict], tools: Sequence[dict],
                 fmt: str) -> list[dict]:
    """The messages the template gets: with the generic format's system message, the tools
    described if the template does not render them, and the history's calls and answers
    as JSON text if it does not render those."""
    found = caps(template)
    out = [dict(m) for m in messages]
    if tools and fmt == GENERIC:
        out = _add_system(out, GENERIC_SYSTEM)
    if tools and not found.tools:
        example = (f"\n\nExample tool call syntax:\n\n{found.call_example}\n\n"
                   if found.call_example else "")
        out = _add_system(out, TOOLS_SYSTEM + _dump([dict(t) for t in tools]) + example)
    return _history(found, out)


def _add_system(messages: list[dict], text: str) -> list[dict]:
    if messages and messages[0]["role"] == "system":
        return [dict(messages[0], content=f"{messages[0]['content']}\n\n{text}"),
                *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def _history(found: Caps, messages: list[dict]) -> list[dict]:
    """Tool calls and tool answers the template does not render, as JSON text: a call in
    its assistant message's content, an answer as a user message."""
    out = []
    for message in messages:
        if message.get("tool_calls") and not found.tool_calls:
            calls = []
            for call in message["tool_calls"]:
                one = {"name": call["function"]["name"],
                       "arguments": call["function"]["arguments"]}
                calls.append(dict(one, id=call["id"]) if "id" in call else one)
            reply = {"tool_calls": calls}
            if message.get("content"):
                reply["content"] = message["content"]
            message = {k: v for k, v in message.items() if k != "tool_calls"}
            message["content"] = _dump(reply)
        if message["role"] == "tool" and not found.tool_responses:
            answer = {k: message[n] for k, n in (("tool", "name"), ("content", "content"),
                                                  ("tool_call_id", "tool_call_id"))
                      if n in message}
            message = {"role": "user", "content": _dump({"tool_response": answer})}
        out.append(message)
    return out


def _dump(value) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False)


def grammar(tools: Sequence[dict], choice: ToolChoice, fmt: str) -> str:
    """The GBNF the answer keeps to (with the native format and tool_choice "auto", from
    its trigger on: `triggers`). GrammarError if a tool's parameters cannot be converted."""
    try:
        return (_native_grammar if fmt == NATIVE else _generic_grammar)(tools, choice)
    except Exception as err:  # noqa: BLE001 (the converter raises whatever it meets)
        raise GrammarError(f"a tool's parameters cannot be turned into a grammar: "
                           f"{type(err).__name__}: {err}") from None


def triggers(choice: ToolChoice, fmt: str) -> tuple[str, ...]:
    """The tokens' texts the grammar waits for (lazy), none if it applies from the start:
    `<tool_call>` for the native format with tool_choice "auto"."""
    return (OPEN,) if fmt == NATIVE and not choice.required else ()


def _converter() -> SchemaConverter:
    return SchemaConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)


def _call_schema(converter: SchemaConverter, tools: Sequence[dict], choice: ToolChoice,
                 with_id: bool = False) -> dict:
    """The schema of one call ({"name", "arguments"}) of any tool, or the one named."""
    schemas = []
    for tool in tools:
        function = tool["function"]
        name = function["name"]
        if choice.function is not None and name != choice.function:
            continue
        parameters = converter.resolve_refs(
            copy.deepcopy(function.get("parameters") or {"type": "object"}), f"tools/{name}")
        schema = {"type": "object", "properties": {
            "name": {"type": "string", "const": name}, "arguments": parameters},
            "required": ["name", "arguments"]}
        if with_id:   # (a call's id, the generic format with parallel calls)
            schema["properties"]["id"] = {"type": "string", "minLength": 4}
            schema["required"].append("id")
        schemas.append(schema)
    return schemas[0] if len(schemas) == 1 else {"anyOf": schemas}


def _native_grammar(tools: Sequence[dict], choice: ToolChoice) -> str:
    converter = _converter()
    call = converter.visit(_call_schema(converter, tools, choice), "tool-call")
    block = f'"{OPEN}\\n" {call} "\\n</tool_call>"'
    root = f'root ::= {block} ("\\n" {block})*' if choice.parallel else f"root ::= {block}"
    return converter.format_grammar() + "\n" + root


def _generic_grammar(tools: Sequence[dict], choice: ToolChoice) -> str:
    converter = _converter()
    calls = _call_schema(converter, tools, choice, with_id=choice.parallel)
    if choice.parallel:
        call = {"type": "object", "properties": {"tool_calls": {
            "type": "array", "items": calls, "minItems": 1}}, "required": ["tool_calls"]}
    else:
        call = {"type": "object", "properties": {"tool_call": calls},
                "required": ["tool_call"]}
    response = {"type": "object", "properties": {"response": {"type": "string"}},
                "required": ["response"]}
    converter.visit(call if choice.required else {"anyOf": [call, response]}, "")
    return converter.format_grammar()
