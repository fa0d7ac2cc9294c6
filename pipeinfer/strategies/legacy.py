"""What specpipe, which still runs a loop of its own, needs until it moves onto the scheduler
core: the prompt's prefill through the pipeline, and accepting tokens with the driver's side
effects."""

from __future__ import annotations

import time
from typing import Callable, Sequence

from ..head import Pipeline
from ..schedule.generation import CANONICAL_SEQ, Generation
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
