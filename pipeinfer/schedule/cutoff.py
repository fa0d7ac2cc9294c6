"""The confidence cutoff with recovery and decay (paper IV-B-2).

The draft keeps a token while its probability is at least the cutoff, p_accept + p_adjust.
p_adjust grows by p_recovery for every speculative run started (speculation gets more
selective the further it runs ahead), is reset to 0 when a completed speculative run is
accepted (the draft is on track), and shrinks by p_decay when speculation yields nothing while
no result waits (a draft attempt that evaluated the draft model and found no token above the
cutoff): the head would otherwise idle, so it accepts less likely tokens.

Decay happens at most once per real draft attempt, never per poll of an idle loop, and never
takes the cutoff below `floor` (or p_accept, if that is lower): a draft token less likely than
FLOOR is almost never the target's choice, and a cutoff that sinks without bound switches the
mechanism off.
"""

from __future__ import annotations

FLOOR = 0.1


class Cutoff:
    def __init__(self, p_accept: float, p_recovery: float, p_decay: float,
                 floor: float = FLOOR):
        self.p_accept, self.p_recovery, self.p_decay = p_accept, p_recovery, p_decay
        self.floor = min(floor, p_accept)
        self.adjust = 0.0

    @property
    def value(self) -> float:
        return self.p_accept + self.adjust

    def run_started(self) -> bool:
        """A speculative run went out; whether the value changed."""
        self.adjust += self.p_recovery
        return self.p_recovery != 0

    def accepted(self) -> bool:
        """A completed speculative run was accepted; whether the value changed."""
        changed = self.adjust != 0
        self.adjust = 0.0
        return changed

    def attempt_failed(self) -> bool:
        """A draft attempt found nothing above the cutoff; whether the value changed."""
        lowest = self.floor - self.p_accept
        new = max(lowest, self.adjust - self.p_decay)
        changed = new < self.adjust
        self.adjust = min(self.adjust, new)
        return changed
