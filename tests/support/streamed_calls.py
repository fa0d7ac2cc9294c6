"""Test helpers: a tool-call stream (serve/tool_calls.stream) fed pieces of an answer, and
its calls' deltas added up as an OpenAI client adds them up, checking on the way that they
are shaped as OpenAI streams a call."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass
class Streamed:
    content: list[str]          # the content each push sent
    deltas: list[list[dict]]    # the call deltas each push sent
    rest: str                   # finish(): the content still to send,
    last: list[dict]            # the call deltas still to send,
    called: bool                # whether the answer has calls

    @property
    def all_deltas(self) -> list[dict]:
        return [d for pushed in self.deltas for d in pushed] + self.last

    def calls(self) -> list[tuple[str, str]]:
        """(name, arguments) of each call, as the deltas add up."""
        return [(name, arguments) for _, name, arguments in add_up(self.all_deltas)]


def streamed(stream, pieces: list[str]) -> Streamed:
    content, deltas = [], []
    for piece in pieces:
        text, calls = stream.push(piece)
        content.append(text)
        deltas.append(calls)
    return Streamed(content, deltas, *stream.finish())


def add_up(deltas: list[dict]) -> list[tuple[str, str, str]]:
    """(id, name, arguments) of each call the deltas stream, in order of their indices.
    A call's first delta has its index (the next one), id, type, name and arguments; the
    next ones only its index and a piece of its arguments, not empty."""
    calls: dict[int, list[str]] = {}
    for delta in deltas:
        index = delta["index"]
        if index not in calls:
            assert index == len(calls), deltas
            assert set(delta) == {"index", "id", "type", "function"}, delta
            assert delta["type"] == "function" and delta["id"].startswith("call_")
            assert set(delta["function"]) == {"name", "arguments"} and delta["function"]["name"]
            calls[index] = [delta["id"], delta["function"]["name"],
                            delta["function"]["arguments"]]
        else:
            assert set(delta) == {"index", "function"}, delta
            assert set(delta["function"]) == {"arguments"} and delta["function"]["arguments"]
            calls[index][2] += delta["function"]["arguments"]
    return [tuple(call) for call in calls.values()]


def splits(text: str, n_random: int = 20) -> list[list[str]]:
    """The text cut one character at a time, in two at every point, and at random (seeded
    by the text) into up to 12 pieces."""
    rng = random.Random(text)
    out = [list(text), *([text[:i], text[i:]] for i in range(1, len(text)))]
    for _ in range(n_random if len(text) > 1 else 0):
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 12))))
        out.append([text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])])
    return out


def chunk_deltas(chunks) -> list[dict]:
    """The tool-call deltas of a streamed answer's chunks (the `openai` client's objects),
    as the server sent them."""
    return [d.model_dump(exclude_unset=True) for c in chunks if c.choices
            for d in (c.choices[0].delta.tool_calls or [])]


@dataclass
class SdkStreamed:
    """A request streamed through the `openai` SDK's helper (client.chat.completions.stream,
    which adds the deltas up and reports each piece of a call's arguments)."""
    final: object             # its final completion
    arguments: list[str]      # the pieces of arguments it reported
    content: list[str]        # the pieces of content
    deltas: list[dict]        # the tool-call deltas as the server sent them

    def calls(self) -> list[tuple[str, str]]:
        return [(c.function.name, c.function.arguments)
                for c in self.final.choices[0].message.tool_calls or []]


def sdk_stream(client, **request) -> SdkStreamed:
    with client.chat.completions.stream(**request) as stream:
        events = list(stream)
        final = stream.get_final_completion()
    arguments = [e.arguments_delta for e in events
                 if e.type == "tool_calls.function.arguments.delta" and e.arguments_delta]
    content = [e.delta for e in events if e.type == "content.delta" and e.delta]
    chunks = [e.chunk for e in events if e.type == "chunk"]
    return SdkStreamed(final, arguments, content, chunk_deltas(chunks))
