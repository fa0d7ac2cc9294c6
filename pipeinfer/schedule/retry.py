"""When the draft model tries again after attempts that found nothing to draft.

An attempt evaluates, one at a time, every token accepted since the draft's last step, then
looks at its first guess: under the cutoff, it drafts nothing. Once the cutoff has decayed to
its floor (cutoff.py) nothing makes the next attempt likelier to draft than the draft's own
confidence, so a draft that is rarely confident would cost the head a draft step per token,
all of it wasted, on the CPU its loop shares. After such an attempt the next one waits for
`wait` more accepted tokens (the draft then reads them in one batch, much cheaper per token),
doubling per failure in a row up to MAX_WAIT; an attempt that drafts anything ends the wait.
A wait of 1 is the plain rule: an attempt is never repeated unchanged.
"""

from __future__ import annotations

MAX_WAIT = 8


class Retry:
    def __init__(self, max_wait: int = MAX_WAIT):
        self.max_wait = max_wait
        self.wait = 0     # accepted tokens the next attempt waits for, counted from `since`
        self.since = 0    # the context's length at the last failed attempt

    def failed(self, n_context: int, at_floor: bool) -> None:
        """An attempt with a context of `n_context` tokens drafted nothing; `at_floor`: the
        cutoff could not decay any further (else the next may try at once, lower)."""
        if not at_floor:
            self.wait = 0
            return
        self.wait = 1 if self.wait == 0 else min(2 * self.wait, self.max_wait)
        self.since = n_context

    def drafted(self) -> None:
        self.wait = 0

    def ready(self, n_context: int) -> bool:
        """Whether an attempt with a context of `n_context` tokens may go out."""
        return n_context >= self.since + self.wait
