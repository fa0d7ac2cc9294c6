"""How big a micro-batch of draft tokens gets, and when it ships (paper IV-B).

A micro-batch is drafted token by token; it ends at `limit` tokens, at the cutoff, or early
when a target stage would otherwise idle (fewer runs in flight than stages): then the tokens
drafted so far are worth more in the pipeline now than more tokens later. Without continuous
speculation (the paper's ablation) one speculative run is in flight at a time, and its
micro-batch may be twice as long instead.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MicroBatch:
    draft: int           # --draft: most tokens per micro-batch (continuous)
    continuous: bool
    n_stages: int        # stages holding target layers

    @property
    def limit(self) -> int:
        return self.draft if self.continuous else 2 * self.draft

    def ship_now(self, in_flight: int) -> bool:
        """Whether the micro-batch being drafted should go out with what it has."""
        return self.continuous and in_flight < self.n_stages
