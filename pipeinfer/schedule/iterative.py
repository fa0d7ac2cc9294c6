"""Iterative pipeline-parallel decoding: one token per pass through the pipeline.

The schedule: prefill the prompt; then one non-speculative run of the newest token at a time,
in sequence 0; its result gives the next token, which starts the next run. Only one run is
ever in flight, so with N stages each is busy 1/N of the time: the baseline that pipelined
speculation fills.
"""

from __future__ import annotations

from .core import Scheduler


class Iterative(Scheduler):
    def on_start(self) -> None:
        self.spec.prefill(self.limits.chunk, self.limits.tail)

    def after_prefill(self) -> None:
        self.start_cover()   # the run of the first token

    def on_result(self, absorbed) -> None:
        self.start_cover()   # the run of the token it gave
