"""The JSON objects of OpenAI's completion and chat completion responses, whole or as
stream chunks (`text_completion`, `chat.completion`, `chat.completion.chunk`), for one or
more choices (`n`, or several prompts: choice i*n + j is prompt i's j-th). As llama-server
does, a choice's last chunk (and a one-choice answer) carries a `timings` object: its speed
and its drafts (by source, under `drafts`)."""

from __future__ import annotations

import secrets
import time

from .requests import Ask
from .events import Done, Piece
from .logprobs import CompletionLogprobs, TokenLogprob, chat_content
from . import tool_calls


class Reply:
    """One request's answer being built from the head's pieces of text, choice by choice."""

    def __init__(self, ask: Ask, model: str, number: int):
        self.ask, self.model = ask, model
        prefix = "chatcmpl" if ask.chat else "cmpl"
        self.id = f"{prefix}-{number}-{secrets.token_hex(6)}"
        self.created = int(time.time())
        self.object = "chat.completion" if ask.chat else "text_completion"
        n = ask.n_choices
        self.text: list[list[str]] = [[] for _ in range(n)]
        self.logprobs: list[list[TokenLogprob]] = [[] for _ in range(n)]
        self._offsets = [CompletionLogprobs() for _ in range(n)]   # (completions' offsets)
        self._tools = [tool_calls.stream(ask.tool_format)
                       for _ in range(n)] if ask.tools else None
        self.dones: dict[int, Done] = {}

    @property
    def complete(self) -> bool:
        """Every choice has ended."""
        return len(self.dones) == self.ask.n_choices

    def add(self, index: int, piece: Piece) -> None:
        self.text[index].append(piece.text)
        self.logprobs[index].extend(piece.logprobs)

    def end(self, index: int, done: Done) -> None:
        self.dones[index] = done

    def _logprobs(self, index: int, entries) -> dict | None:
        """Choice `index`'s `logprobs` for `entries` (null unless the request asked)."""
        if self.ask.logprobs is None:
            return None
        if self.ask.chat:
            return {"content": chat_content(entries), "refusal": None}
        return self._offsets[index].add(entries)

    def usage(self) -> dict:
        """Each prompt's tokens once (and of them, those reused from a slot's cache), every
        choice's completion tokens."""
        n = self.ask.n
        prompt = sum(d.prompt_tokens for i, d in self.dones.items() if i % n == 0)
        cached = sum(d.cached_tokens for i, d in self.dones.items() if i % n == 0)
        completion = sum(d.completion_tokens for d in self.dones.values())
        return {"prompt_tokens": prompt, "completion_tokens": completion,
                "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": cached}}

    def _envelope(self, obj: str, choices: list) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "choices": choices}

    def whole(self) -> dict:
        """The response once every choice has ended."""
        choices = []
        for i in range(self.ask.n_choices):
            text, logprobs = "".join(self.text[i]), self._logprobs(i, self.logprobs[i])
            reason = self.dones[i].finish_reason
            if self.ask.chat:
                content, calls = (tool_calls.parse(self.ask.tool_format, text)
                                  if self.ask.tools else (text, []))
                message = {"role": "assistant", "content": content}
                if calls:
                    message["tool_calls"] = [c.json() for c in calls]
                    reason = "tool_calls" if reason == "stop" else reason
                choices.append({"index": i, "message": message, "logprobs": logprobs,
                                "finish_reason": reason})
            else:
                choices.append({"index": i, "text": text, "logprobs": logprobs,
                                "finish_reason": reason})
        whole = dict(self._envelope(self.object, choices), usage=self.usage())
        if len(self.dones) == 1 and self.dones[0].timings is not None:
            whole["timings"] = self.dones[0].timings   # (llama-server's, one choice)
        return whole

    # --- streaming --------------------------------------------------------------------------
    def _chunk_object(self) -> str:
        return "chat.completion.chunk" if self.ask.chat else "text_completion"

    def _choice(self, index: int, text: str | None, finish_reason: str | None,
                logprobs: dict | None = None) -> dict:
        if self.ask.chat:
            delta = {} if text is None else {"content": text}
            return {"index": index, "delta": delta, "logprobs": logprobs,
                    "finish_reason": finish_reason}
        return {"index": index, "text": text or "", "logprobs": logprobs,
                "finish_reason": finish_reason}

    def opening(self) -> list[dict]:
        """Chunks sent before any text: the assistant's role of each choice, for chat."""
        if not self.ask.chat:
            return []
        return [self._envelope(self._chunk_object(), [
            {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
             "finish_reason": None}]) for i in range(self.ask.n_choices)]

    def chunk(self, index: int, piece: Piece) -> dict | None:
        """The stream chunk of a piece: its text (with tools: the content, and the deltas
        of the calls being written), and the logprobs of its tokens if asked; None if there
        is nothing to send."""
        text, calls = self._tools[index].push(piece.text) if self._tools else (piece.text, [])
        if not (text or calls or piece.logprobs):
            return None
        choice = self._choice(index, text if text or not calls else None, None,
                              self._logprobs(index, piece.logprobs))
        if calls:
            choice["delta"]["tool_calls"] = calls
        return self._envelope(self._chunk_object(), [choice])

    def finished(self, index: int) -> list[dict]:
        """The chunks ending choice `index`: with tools, the text held back and the deltas
        of the calls not sent yet; then its finish reason."""
        reason, chunks = self.dones[index].finish_reason, []
        if self._tools:
            rest, calls, called = self._tools[index].finish()
            if rest:
                chunks.append(self._envelope(self._chunk_object(),
                                             [self._choice(index, rest, None)]))
            if calls:
                chunks.append(self._envelope(self._chunk_object(), [
                    {"index": index, "delta": {"tool_calls": calls}, "logprobs": None,
                     "finish_reason": None}]))
            if called:
                reason = "tool_calls" if reason == "stop" else reason
        last = self._envelope(self._chunk_object(), [self._choice(index, None, reason)])
        if self.dones[index].timings is not None:
            last["timings"] = self.dones[index].timings   # (this choice's: llama-server's)
        return chunks + [last]

    def closing(self) -> list[dict]:
        """After every choice's end: the usage chunk (no choices) if asked."""
        if not self.ask.include_usage:
            return []
        return [dict(self._envelope(self._chunk_object(), []), usage=self.usage())]
