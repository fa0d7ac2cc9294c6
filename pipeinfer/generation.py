"""State shared by every strategy on the head: the accepted tokens, stop conditions, timing,
and the prefill of the prompt through the pipeline."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence


from .head import Pipeline
from .metrics import Counters, Timeline
from .transaction import DecodeTx, RunResult

CANONICAL_SEQ = 0  # sequence 0 holds the accepted tokens on every stage


@dataclass(frozen=True)
class Request:
    prompt: tuple[int, ...]
    n_predict: int
    n_ctx: int
    ignore_eos: bool = False


@dataclass
class Generation:
    """Accepted tokens of one request. `accept` records tokens, in order, and says when to stop."""
    request: Request
    is_eog: Callable[[int], bool]
    on_token: Callable[[int], None] = lambda token: None
    tokens: list[int] = field(default_factory=list)
    timeline: Timeline = field(default_factory=Timeline)
    counters: Counters = field(default_factory=Counters)
    stop_reason: str = ""
    run_ids: itertools.count = field(default_factory=itertools.count)
    extras: dict = field(default_factory=dict)  # strategy-specific results for the JSON

    @property
    def n_past(self) -> int:
        """Positions already holding accepted tokens (prompt + generated, last one excluded
        until it has been evaluated)."""
        return len(self.request.prompt) + len(self.tokens)

    @property
    def done(self) -> bool:
        return bool(self.stop_reason)

    def accept(self, tokens: Sequence[int]) -> None:
        for token in tokens:
            if self.done:
                return
            self.tokens.append(int(token))
            self.timeline.mark_token()
            self.on_token(int(token))
            if not self.request.ignore_eos and self.is_eog(int(token)):
                self.stop_reason = "eos"
            elif len(self.tokens) >= self.request.n_predict:
                self.stop_reason = "length"
            elif self.n_past >= self.request.n_ctx:
                self.stop_reason = "context"

    def next_run_id(self) -> int:
        return next(self.run_ids)


def prefill(pipe: Pipeline, gen: Generation, n_batch: int,
            idle: Callable[[], None] | None = None) -> RunResult:
    """Evaluate the prompt in chunks of at most n_batch tokens (all in flight at once) into
    sequence 0; return the result holding the output for its last token. `idle` runs while the head waits (the
    draft model reads the prompt meanwhile)."""
    prompt = gen.request.prompt
    gen.timeline.start = time.perf_counter()
    chunks = [range(i, min(i + n_batch, len(prompt))) for i in range(0, len(prompt), n_batch)]
    for k, chunk in enumerate(chunks):
        last = k == len(chunks) - 1
        tx = DecodeTx(gen.next_run_id(), tuple(chunk), ((CANONICAL_SEQ,),) * len(chunk),
                      tuple(last and i == chunk[-1] for i in chunk))
        pipe.decode(tx, [prompt[i] for i in chunk])
        gen.counters.runs_started += 1
    result = None
    for _ in chunks:
        result = pipe.wait(idle)
    gen.timeline.prefill_done = time.perf_counter()
    return result
