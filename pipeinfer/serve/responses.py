"""The JSON objects of OpenAI's completion and chat completion responses, whole or as
stream chunks (`text_completion`, `chat.completion`, `chat.completion.chunk`)."""

from __future__ import annotations

import secrets
import time

from .api import Ask
from .bridge import Done, Piece
from .logprobs import CompletionLogprobs, TokenLogprob, chat_content


class Reply:
    """One request's answer being built from the head's pieces of text."""

    def __init__(self, ask: Ask, model: str, number: int):
        self.ask, self.model = ask, model
        prefix = "chatcmpl" if ask.chat else "cmpl"
        self.id = f"{prefix}-{number}-{secrets.token_hex(6)}"
        self.created = int(time.time())
        self.object = "chat.completion" if ask.chat else "text_completion"
        self.text: list[str] = []
        self.logprobs: list[TokenLogprob] = []
        self._offsets = CompletionLogprobs()   # (completions: text offsets so far)

    def add(self, piece: Piece) -> None:
        self.text.append(piece.text)
        self.logprobs.extend(piece.logprobs)

    def _logprobs(self, entries) -> dict | None:
        """A choice's `logprobs` for `entries` (null unless the request asked)."""
        if self.ask.logprobs is None:
            return None
        if self.ask.chat:
            return {"content": chat_content(entries), "refusal": None}
        return self._offsets.add(entries)

    @staticmethod
    def usage(done: Done) -> dict:
        return {"prompt_tokens": done.prompt_tokens, "completion_tokens": done.completion_tokens,
                "total_tokens": done.prompt_tokens + done.completion_tokens}

    def _envelope(self, obj: str, choices: list) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "choices": choices}

    def whole(self, done: Done) -> dict:
        text, logprobs = "".join(self.text), self._logprobs(self.logprobs)
        if self.ask.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "logprobs": logprobs, "finish_reason": done.finish_reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": logprobs,
                      "finish_reason": done.finish_reason}
        return dict(self._envelope(self.object, [choice]), usage=self.usage(done))

    # --- streaming --------------------------------------------------------------------------
    def _chunk_object(self) -> str:
        return "chat.completion.chunk" if self.ask.chat else "text_completion"

    def _choice(self, text: str | None, finish_reason: str | None,
                logprobs: dict | None = None) -> dict:
        if self.ask.chat:
            delta = {} if text is None else {"content": text}
            return {"index": 0, "delta": delta, "logprobs": logprobs,
                    "finish_reason": finish_reason}
        return {"index": 0, "text": text or "", "logprobs": logprobs,
                "finish_reason": finish_reason}

    def opening(self) -> list[dict]:
        """Chunks sent before any text: the assistant's role, for chat."""
        if not self.ask.chat:
            return []
        choice = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                  "finish_reason": None}
        return [self._envelope(self._chunk_object(), [choice])]

    def chunk(self, piece: Piece) -> dict:
        """The stream chunk of a piece: its text, and the logprobs of its tokens if asked."""
        return self._envelope(self._chunk_object(), [
            self._choice(piece.text, None, self._logprobs(piece.logprobs))])

    def closing(self, done: Done) -> list[dict]:
        """The chunk with the finish reason; then the usage chunk (no choices) if asked."""
        chunks = [self._envelope(self._chunk_object(), [self._choice(None, done.finish_reason)])]
        if self.ask.include_usage:
            chunks.append(dict(self._envelope(self._chunk_object(), []),
                               usage=self.usage(done)))
        return chunks
