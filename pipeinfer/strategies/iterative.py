"""Iterative pipeline-parallel decoding: one token per pass through the pipeline."""

from __future__ import annotations

from ..generation import CANONICAL_SEQ, Generation, prefill
from ..head import Pipeline
from ..sampling import Sampler
from ..transaction import DecodeTx


def run(pipe: Pipeline, gen: Generation, sampler: Sampler, cfg, drafter=None, pool=None) -> None:
    gen.accept([prefill(pipe, gen, cfg.n_batch).token(-1, sampler)])
    while not gen.done:
        pos = gen.n_past - 1  # the newest token has not been evaluated yet
        tx = DecodeTx(gen.next_run_id(), (pos,), ((CANONICAL_SEQ,),), (True,))
        pipe.decode(tx, [gen.tokens[-1]])
        gen.counters.runs_started += 1
        gen.accept([pipe.wait().token(0, sampler)])
