"""The never-slower guard: speculation stops while it does not pay, and probes again later.

Speculative runs share the stages with the run that decodes the next token, so drafts that are
mostly rejected cost more than they bring (an unrelated draft makes pipeinfer slower than
plain decoding). The guard watches what every speculative run brought when it left the run
table: its guessed tokens, and how many of them were accepted (none when it was cancelled or
rejected). A run that continued another run's rejected guess is not shown to it (core.py): it
was cancelled for that one mistake, and its own guesses were never judged. Once the last
`window` guessed tokens were accepted at a rate under `threshold`, speculation *pauses* for
`pause` generated tokens (plain decoding: no draft, no speculative run); then it *probes*: it
speculates again with an empty window. A probe that fails doubles
the pause (at most `max_pause`); a window that pays resets the pause to its first length.
A threshold of 0 turns the guard off.
"""

from __future__ import annotations

from collections import deque

THRESHOLD = 0.2     # --guard-accept: the acceptance rate under which speculation pauses
WINDOW = 16         # guessed tokens a decision looks at
FIRST_PAUSE = 8     # generated tokens of the first pause
MAX_PAUSE = 256


class Guard:
    def __init__(self, threshold: float = THRESHOLD, window: int = WINDOW,
                 first_pause: int = FIRST_PAUSE, max_pause: int = MAX_PAUSE):
        self.threshold, self.window = threshold, window
        self.first_pause, self.max_pause = first_pause, max_pause
        self.pause = first_pause
        self.samples: deque[tuple[int, int]] = deque()   # (guessed, accepted) per run
        self.resume_at: int | None = None   # paused until this many tokens are generated
        self.probing = False                # the window after a pause: one chance

    @property
    def enabled(self) -> bool:
        return self.threshold > 0

    def allows(self, n_generated: int) -> tuple[bool, str | None]:
        """Whether to speculate now, and why the state just changed (None: it did not)."""
        if self.resume_at is None:
            return True, None
        if n_generated < self.resume_at:
            return False, None
        self.resume_at, self.probing = None, True
        return True, f"probing after a pause of {self.pause}"

    def observe(self, guessed: int, accepted: int, n_generated: int) -> str | None:
        """A speculative run left the table; the reason if this paused speculation."""
        if not self.enabled or guessed <= 0 or self.resume_at is not None:
            return None
        self.samples.append((guessed, accepted))
        total = sum(g for g, _ in self.samples)
        while total - self.samples[0][0] >= self.window:   # keep just over `window`
            total -= self.samples.popleft()[0]
        if total < self.window:
            return None
        rate = sum(a for _, a in self.samples) / total
        if rate >= self.threshold:
            if self.probing:
                self.pause, self.probing = self.first_pause, False
            return None
        if self.probing:
            self.pause = min(2 * self.pause, self.max_pause)
        self.samples.clear()
        self.resume_at, self.probing = n_generated + self.pause, False
        return f"acceptance {rate:.2f} < {self.threshold:g}: pause for {self.pause} tokens"
