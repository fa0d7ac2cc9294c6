"""What the job sends back about a request, choice by choice: pieces of its text, its end,
an embedding request's vectors, or a failure. The front turns them into HTTP answers
(responses.py) and keeps the tokens of each choice, so that a request resumed on a new job
goes on where it stopped."""

from __future__ import annotations

from dataclasses import dataclass

from .logprobs import TokenLogprob


@dataclass(frozen=True)
class Piece:
    """Text of the completion (maybe empty while a stop string is possible), the number of
    tokens it took (`token`: the one, when it took one), and their logprobs if the request
    asked for them."""
    text: str
    n_tokens: int
    logprobs: tuple[TokenLogprob, ...] = ()
    token: int | None = None


@dataclass(frozen=True)
class Done:
    """The completion ended: finish_reason "stop" or "length", and the token counts
    (`cached_tokens`: the prompt's prefix reused from its slot, not evaluated again); `text`:
    the answer's last text, held back until the end (one event with the end, so an answer
    resumed after a failure never gets it twice); `timings`: its speed and drafts, as the
    answer's `timings` object gives them (serve/stats.answer_timings)."""
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    text: str = ""
    timings: dict | None = None


@dataclass(frozen=True)
class Embedded:
    """An embedding request's answer: each input's vector (float32), and the tokens of all
    its inputs."""
    vectors: tuple
    prompt_tokens: int


@dataclass(frozen=True)
class Failed:
    """The request could not be completed (ApiError's fields)."""
    status: int
    message: str
