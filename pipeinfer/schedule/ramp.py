"""How long pipeinfer's next n-gram run may be: one token right after speculation broke, then
one more per speculative run started, up to the micro-batch limit.

A lookup answers a job at once with as many copied tokens as the job allows, so the runs that
start a chain go out together, each full size. When a chain starts, the pending token's run
(one token) is already in flight; the first speculative run then covers the next position. If
its first guess is right and a later one wrong, the token after it waits for the whole run at
every stage: on the emulated 4-node cluster (Qwen2.5-Coder 1.5B) 420 ms for that one token
against 265 ms for a one-token run. A chain that goes on loses nothing by starting short: the
last stage, the slowest, still gets its next run in time (runs of 1 and 2 tokens leave the
first stages sooner), and from the third run on they are full size again. So the chain's first
runs are short (1, 2, then `top` tokens), and speculation *breaks* whenever the head has to
start a one-token run of the pending token (a mismatch, or no draft covered it).
"""

from __future__ import annotations


class Ramp:
    def __init__(self, top: int, first: int = 1):
        if not 1 <= first <= top:
            raise ValueError(f"ramp sizes must satisfy 1 <= first <= top, got {first}, {top}")
        self.top, self.first = top, first
        self.size = first        # most tokens of the next n-gram run

    def started(self) -> None:
        """A speculative run went out: the chain goes on, the next run may be longer."""
        self.size = min(self.size + 1, self.top)

    def broke(self) -> bool:
        """The pending token needed a run of its own: start short again. True if that
        changed the size (for the trace)."""
        changed = self.size != self.first
        self.size = self.first
        return changed
