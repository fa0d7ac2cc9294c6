"""One generation's accepted tokens and stop conditions (pure: the driver keeps the clock)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Callable, Sequence

from .counters import Counters, Timeline

CANONICAL_SEQ = 0  # sequence 0 holds the accepted tokens on every stage


@dataclass(frozen=True)
class Request:
    prompt: tuple[int, ...]
    n_predict: int
    n_ctx: int
    ignore_eos: bool = False
    cached: int = 0     # positions [0, cached) already in sequence 0: a kept prefix of the
    # prompt, or for a resumed request the cells the ranks kept (past the prompt, maybe)
    # Tokens generated before (by a job that ended): evaluated after the prompt in runs of
    # the exact run size, as they were when generated, then the generation goes on from them.
    resumed: tuple[int, ...] = ()


@dataclass
class Generation:
    """Accepted tokens of one request. `accept` records tokens, in order, and says when to
    stop; the driver marks their time on `timeline` and hands them to `on_token`."""
    request: Request
    is_eog: Callable[[int], bool]
    on_token: Callable[[int], None] = lambda token: None
    tokens: list[int] = field(default_factory=list)
    timeline: Timeline = field(default_factory=Timeline)
    counters: Counters = field(default_factory=Counters)
    stop_reason: str = ""
    run_ids: itertools.count = field(default_factory=itertools.count)
    extras: dict = field(default_factory=dict)  # strategy-specific results for the JSON

    def __post_init__(self) -> None:
        if self.request.resumed and not self.tokens:
            self.tokens = list(self.request.resumed)  # (never handed to on_token again)

    @property
    def n_past(self) -> int:
        """Positions already holding accepted tokens (prompt + generated, last one excluded
        until it has been evaluated)."""
        return len(self.request.prompt) + len(self.tokens)

    @property
    def accepted(self) -> list[int]:
        """Prompt and generated tokens; the last one is pending (not evaluated yet)."""
        return list(self.request.prompt) + self.tokens

    def last(self, n: int) -> list[int]:
        """The newest `n` accepted tokens, prompt included (the penalties' window)."""
        tokens, prompt = self.tokens, self.request.prompt
        if n <= len(tokens):
            return tokens[len(tokens) - n:]
        return list(prompt[max(0, len(prompt) - (n - len(tokens))):]) + tokens

    @property
    def pending(self) -> int:
        """Position of the newest accepted token."""
        return self.n_past - 1

    @property
    def done(self) -> bool:
        return bool(self.stop_reason)

    def accept(self, tokens: Sequence[int]) -> list[int]:
        """Append `tokens` until a stop condition holds; the ones appended."""
        taken = []
        for token in tokens:
            if self.done:
                break
            token = int(token)
            self.tokens.append(token)
            taken.append(token)
            if not self.request.ignore_eos and self.is_eog(token):
                self.stop_reason = "eos"
            elif len(self.tokens) >= self.request.n_predict:
                self.stop_reason = "length"
            elif self.n_past >= self.request.n_ctx:
                self.stop_reason = "context"
        return taken

    def record(self, tokens: Sequence[int]) -> None:
        """The driver's side of accepting: time marks and the token callback."""
        self.timeline.mark_token(len(tokens))
        for token in tokens:
            self.on_token(int(token))

    def next_run_id(self) -> int:
        return next(self.run_ids)
