"""What pipespec and specpipe, which still run loops of their own, need until they move onto
the scheduler core: the prompt's prefill through the pipeline, accepting tokens with the
driver's side effects, and the core's Speculation carrying out its actions at once."""

from __future__ import annotations

import time
from typing import Callable, Sequence

from ..head import Pipeline
from ..schedule import actions as A
from ..schedule.generation import CANONICAL_SEQ, Generation
from ..schedule.speculation import Speculation
from ..transaction import DecodeTx, RunResult


def accept(gen: Generation, tokens: Sequence[int]) -> None:
    gen.record(gen.accept(tokens))


def prefill(pipe: Pipeline, gen: Generation, n_batch: int,
            idle: Callable[[], None] | None = None) -> RunResult:
    """Evaluate the prompt in chunks of at most n_batch tokens (all in flight at once) into
    sequence 0; return the result holding the output for its last token. `idle` runs while
    the head waits (the draft model reads the prompt meanwhile)."""
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


class ImmediateSpeculation(Speculation):
    """The core's Speculation whose actions go to the pipeline as they are emitted."""

    def __init__(self, pipe: Pipeline, gen: Generation, sampler, pool, kv_cells: int,
                 cancel: bool = True):
        super().__init__(gen, sampler, pool, kv_cells, cancel)
        self.pipe = pipe

    def emit(self, action) -> None:
        if isinstance(action, A.StartRun):
            self.pipe.decode(action.tx, list(action.tokens))
        elif isinstance(action, A.KvOps):
            self.pipe.kv(list(action.ops))
        elif isinstance(action, A.CancelRuns):
            self.pipe.cancel(list(action.run_ids))
        elif isinstance(action, A.EmitTokens):
            self.gen.record(action.tokens)

    def settle(self) -> None:
        """After generation: absorb (and discard) every run still in flight."""
        while self.fifo:
            self.discard(self.pipe.wait())
