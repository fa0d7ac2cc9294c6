"""What one more row of a run costs a pipeline stage, measured on the stage itself.

A speculative run of k draft tokens is evaluated by every stage as one batch of k rows. Its
k-th token is worth sending only if its chance of being accepted pays for what that row adds
to the run, and that depends on the host's kernels, not on a rule of thumb: where llama.cpp
takes a small batch one row at a time (repacked Q4_K and Q4_0 under four rows on some
AVX-512 hosts) a second row costs most of a run of its own; where it reads the weights once
for every row (the same files on other hosts) it costs a fraction. Every worker times its
stage at start-up (`time_rows`: a few decodes of zero activations, in cells removed at once),
the head keeps the slowest stage's figures (`marginal`) and the drafter stops a branch
before a token whose chance of being reached does not pay for its row
(engine/drafting/drafter.py).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import numpy as np

SIZES = (1, 2, 3, 4)   # run sizes timed (exact runs are at most 3 rows with repacked weights)
REPS = 2               # each size's time is the least of this many decodes


def time_rows(stage, sizes: Sequence[int] = SIZES, reps: int = REPS) -> tuple[float, ...]:
    """Seconds a decode of each of `sizes` rows takes on `stage` (a worker's: fed
    activations), the least of `reps`, after one decode that pages the weights in. Zero
    activations at positions 0.. of sequence 0, whose cells are removed after each decode:
    the stage is left empty, as it was."""
    zeros = np.zeros((max(sizes), stage.n_embd), dtype=np.float32)

    def decode(k: int) -> float:
        t0 = time.perf_counter()
        stage.decode(list(range(k)), [(0,)] * k, embd=zeros[:k])
        elapsed = time.perf_counter() - t0
        stage.seq_rm(0)
        return elapsed

    decode(1)
    best = {k: math.inf for k in sizes}
    for _ in range(reps):
        for k in sizes:
            best[k] = min(best[k], decode(k))
    return tuple(best[k] for k in sizes)


def marginal(per_rank: Sequence[Sequence[float]]) -> tuple[float, ...]:
    """What each row after the first adds to a run on the slowest stage (the one whose
    one-row run takes longest, which paces the pipeline), as a fraction of its one-row run:
    for runs of sizes 1..n, the n - 1 fractions of rows 2..n. Empty when no stage was timed."""
    timed = [tuple(c) for c in per_rank if c]
    if not timed:
        return ()
    slowest = max(timed, key=lambda c: c[0])
    return tuple(max(0.0, (slowest[i] - slowest[i - 1]) / slowest[0])
                 for i in range(1, len(slowest)))


def row_cost(costs: Sequence[float], row: int) -> float:
    """The fraction `marginal` gave for the `row`-th row of a run (1-based, row >= 2); rows
    beyond those timed cost what the last timed one did; 0 with nothing timed."""
    if not costs or row < 2:
        return 0.0
    return costs[min(row - 2, len(costs) - 1)]
