"""The never-slower guard: speculation goes on only while a token costs less time with it.

Speculative runs share the stages with the run that decodes the next token, and the draft
model shares the head's CPU with the loop that feeds the pipeline, so a draft that is mostly
wrong makes generation slower than plain decoding. Whether it does depends on this host and
this pipeline (how fast the stages are against the draft, the links, the head's quota), so the
guard compares measured times, not an acceptance rate against a threshold:

- plain: seconds per token of plain decoding, measured while speculation is paused: the
  median round trip of the pause's *clean* runs, one-token runs sent into an empty pipeline
  while no draft job was out and returned before another began (the draft model shares the
  head's CPU and, on an emulated cluster, the machine with the stages: a run timed beside
  draft work is slower than plain decoding is, and a draft that does not pay would look
  harmless against it). Without clean runs in a pause, the time per token of its own runs.
- speculating: seconds per token over the last `window` to HISTORY `window` tokens generated
  while speculating (from the first token that arrived after speculation began). Speculation
  delivers tokens in bursts (a run accepting three, then a gap), so a figure over a few of
  them swings widely around its mean; judged at every token, a short window would pause
  speculation that pays on a stretch that happened to be slow. A long one still judges a
  phase's first `window` tokens alone, so a draft that does not pay is caught as soon.

After `window` tokens of a phase that did at least `window` units of draft work (a guessed
token sent, or a token the draft model evaluated in an attempt that found nothing confident
enough, at least one per attempt: both take the head's CPU; n-gram lookups that found nothing
cost nothing), and at every token after,
speculation pauses when its seconds per token exceed plain decoding's by more than MARGIN
plus SPREAD standard errors of its figure (a draft that neither helps nor hurts is left alone
rather than paused on noise; a figure over a few bursts proves little, and a pause is dearer
than going on one more token, after which the guard judges again): plain decoding
for `pause` tokens, then a *probe* (speculation again, judged after `window` tokens). A probe
that is not faster than plain decoding doubles the pause (at most `max_pause`), whether it
pauses now or, within the margin, later; speculation faster than plain decoding resets it to
`first_pause`.
Without a plain figure yet, the first decision pauses to measure one (until MEASURE clean
runs came back, at most MEASURE_MAX arrivals of the pause's own runs: the speculative runs
still in flight deliver tokens first, at speculation's pace) and then judges the window it
had timed: a draft that does not pay pauses at once, without another window.

A probe first asks the draft model how it would have done: the job that starts it catches the
draft up on the tokens of the pause and scores them (engine/drafting/drafter.py), the share
of the positions where its likeliest next token reached the cutoff that were right (over
every pause since speculation last ran, one more position counted as wrong). From the
phase that paused speculation last, with g guesses sent (verified or cancelled) per token
generated, a of them accepted, at s seconds a token against plain decoding's p, a linear
account (an accepted guess saves a plain token's time; every guess costs c, and carries the
draft's other work with it) gives c = p (s/p - 1)/g + a p: a guess pays when it is right more
often than a* = (s/p - 1)/g + a. A draft that agreed no more often over the pause pauses
again at once (as a failed probe) without sending a guess, until the pause reaches
`max_pause`: that probe is timed whatever the score (the host or the text may have changed
since speculation last ran). One position scores a single step ahead, so it
overrates a run's deeper guesses: a draft that would not pay may still probe, never the
reverse.

Guesses none of which the target accepted cannot have brought a token sooner (each token
still came from a run's own next token, as in plain decoding), so they need no clock: once a
phase's verified runs held `window` guesses and not one was accepted, speculation pauses at
once, as after a failed probe (a figure for plain decoding or not: the pause measures one).

The clock is a parameter so that the policy can be tested on scripted times.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from typing import Callable

WINDOW = 8          # tokens generated while speculating before a decision
HISTORY = 8         # speculation's figure spans at most this many windows
FIRST_PAUSE = 16    # generated tokens of the first pause
MAX_PAUSE = 256
MARGIN = 0.03      # speculation pauses when over (1 + MARGIN) x plain decoding's time
MEASURE = 3        # clean runs that give a first plain figure
MEASURE_MAX = 12   # ... or after this many arrivals of the pause's own runs
SMOOTHING = 0.5     # weight of a new plain-decoding figure against the previous ones
SPREAD = 1.0        # standard errors of speculation's figure it must exceed plain's by


class Guard:
    def __init__(self, enabled: bool = True, window: int = WINDOW,
                 first_pause: int = FIRST_PAUSE, max_pause: int = MAX_PAUSE,
                 clock: Callable[[], float] = time.perf_counter):
        self.enabled, self.window = enabled, window
        self.first_pause, self.max_pause = first_pause, max_pause
        self.clock = clock
        self.pause = first_pause
        self.plain_s: float | None = None      # seconds per token of plain decoding
        self.spec_s: float | None = None       # ... while speculating, at the last decision
        self.marks: deque[tuple[int, float]] = deque()  # (tokens generated, time) this phase
        self.resume_at: int | None = None      # paused until this many tokens are generated
        self.probing = False                   # the phase after a pause: one chance
        self.asked = False                     # the strategy asked: it speculates
        self.drafted_units = 0                 # draft work in this phase (see above)
        self.judged = 0                        # ... guesses of its verified runs
        self.accepted = 0                      # ... of which the target accepted
        self.paused_for = 0                   # the length of the pause under way
        self.measuring = False                 # the pause under way measures a first figure
        self._sent: dict[int, float] = {}      # clean runs out: one token, pipeline empty
        self._clean: list[float] = []          # round trips of this pause's clean runs
        self._own = 0                          # ... arrivals of its own runs
        self.guessed = 0                       # guesses sent so far (the scheduler's count)
        self._phase: tuple[int, float, int] | None = None  # (tokens, time, guessed) at the
        #                                        phase's start
        self._failed: tuple[float, float, float] | None = None  # (s, g, a) that paused it
        self.wants_score = False               # a probe waits for the draft's agreement
        self._score = [0, 0, 0]                # ... over the pauses since `_failed`

    @property
    def paused(self) -> bool:
        return self.resume_at is not None

    # --- what the scheduler reports ---------------------------------------------------------
    def sent_alone(self, run_id: int) -> None:
        """A one-token, non-speculative run went into an empty pipeline with no draft job out."""
        if self.enabled and self.resume_at is not None:
            self._sent[run_id] = self.clock()

    def draft_began(self) -> None:
        """A draft job (or the draft's warm-up) began: runs out now are timed beside it."""
        self._sent.clear()

    def drafted(self, n: int = 1, accepted: int | None = None) -> None:
        """Draft work: a speculative run with `n` guessed tokens left the pipeline (`accepted`
        of them, if it was verified), or a draft model's attempt that drafted nothing
        evaluated `n` tokens."""
        self.drafted_units += n
        if accepted is not None:
            self.judged += n
            self.accepted += accepted

    def returned(self, run_id: int) -> None:
        """A run's result came back (or it was dropped)."""
        sent = self._sent.pop(run_id, None)
        if sent is not None and self.resume_at is not None:
            self._clean.append(self.clock() - sent)

    def generated(self, n_generated: int, speculative: bool = False) -> str | None:
        """Tokens were accepted (`n_generated` in all), by a speculative run's result or not;
        the reason if this paused speculation."""
        if not self.enabled or not self.asked:   # (iterative never asks)
            return None
        if self.resume_at is not None:
            if not speculative:   # (a pause's own tokens: not a run's sent before it)
                self.marks.append((n_generated, self.clock()))
                self._own += 1
            return None
        self.marks.append((n_generated, self.clock()))
        if self._phase is None:
            self._phase = (*self.marks[-1], self.guessed)
        if self.judged >= self.window and not self.accepted:
            self._end_probe(paid=False)
            return self._pause(n_generated, f"{self.judged} guesses, none accepted")
        while len(self.marks) > 2 and n_generated - self.marks[1][0] >= HISTORY * self.window:
            self.marks.popleft()
        first_n, first_t = self.marks[0]
        if n_generated - first_n < self.window or self.drafted_units < self.window:
            return None
        self.spec_s = (self.marks[-1][1] - first_t) / (n_generated - first_n)
        if self.plain_s is None:
            self.measuring = True
            return self._pause(n_generated, "no plain-decoding figure yet: measuring one",
                               MEASURE_MAX)
        return self._judge(n_generated)

    def scored(self, agreement: tuple[int, int, int] | None, n_generated: int,
               final: bool) -> str | None:
        """The draft's score on tokens it caught up on (a job's, `final` once it drafted: the
        catching up is over); the reason if this paused speculation again."""
        if not self.wants_score:
            return None
        if agreement is not None:
            self._score = [x + y for x, y in zip(self._score, agreement)]
        if not final:
            return None
        self.wants_score = False   # (a draft that does not score answers None: no verdict)
        if agreement is None:
            return None
        seen, confident, right = self._score
        need = self._breakeven()
        rate = right / (confident + 1)   # (a few confident positions prove little)
        if need is None or seen < self.window or rate > need:
            return None
        self._end_probe(paid=False)
        return self._pause(n_generated, f"the draft was right on {right} of {confident} "
                                        f"confident guesses over the pauses ({rate:.2f}; "
                                        f"{need:.2f} would pay)")

    def _breakeven(self) -> float | None:
        """a* of the phase that paused speculation last (see above); None if not known."""
        if self._failed is None or not self.plain_s:
            return None
        spent, rate, accepted = self._failed
        return (spent / self.plain_s - 1) / rate + accepted

    def _judge(self, n_generated: int) -> str | None:
        """Speculation's figure against plain decoding's: the reason if this paused it. A
        probe that was not faster doubles the pause, paused now (over the margin) or later
        (within it: left alone until then)."""
        self._end_probe(paid=self.spec_s <= self.plain_s)
        if self.spec_s <= self.plain_s * (1 + MARGIN) + SPREAD * _error(self.marks):
            return None
        return self._pause(n_generated, f"{1000 * self.spec_s:.0f} ms a token speculating > "
                                        f"{1000 * self.plain_s:.0f} ms plain")

    def allows(self, n_generated: int) -> tuple[bool, str | None]:
        """Whether to speculate now, and why the state just changed (None: it did not)."""
        self.asked = True
        if self.resume_at is None:
            return True, None
        if self.measuring:
            if len(self._clean) < MEASURE and self._own < MEASURE_MAX:
                return False, None
        elif n_generated < self.resume_at:
            return False, None
        measuring, self.measuring = self.measuring, False
        self._measure_pause()
        self.resume_at, self.probing = None, not measuring
        self.wants_score = (self.probing and self.paused_for < self.max_pause
                            and self._breakeven() is not None)
        self._phase = None
        self.marks.clear()
        self.drafted_units = self.judged = self.accepted = 0
        plain = "" if self.plain_s is None else f" ({1000 * self.plain_s:.0f} ms a token plain)"
        if not measuring:
            return True, f"probing after a pause of {self.paused_for}{plain}"
        if self.spec_s is not None and self.plain_s is not None:
            why = self._judge(n_generated)   # the window timed before the measurement
            if why:
                return False, f"measured plain decoding; {why}"
        return True, f"measured plain decoding{plain}"

    # --- phases ---------------------------------------------------------------------------------
    def _end_probe(self, paid: bool) -> None:
        """A phase was judged: speculation that paid makes pauses short again; a probe that
        did not doubles the pause (at most `max_pause`)."""
        probing, self.probing = self.probing, False
        if paid:
            self.pause, self._failed = self.first_pause, None
        elif probing:
            self.pause = min(2 * self.pause, self.max_pause)

    def _pause(self, n_generated: int, why: str, length: int | None = None) -> str:
        length = self.paused_for = length or self.pause
        sent = self.guessed - self._phase[2] if self._phase is not None else 0
        if sent > 0 and n_generated > self._phase[0]:
            n = n_generated - self._phase[0]
            self._failed = ((self.clock() - self._phase[1]) / n, sent / n, self.accepted / sent)
            self._score = [0, 0, 0]
        self.wants_score = False
        self.resume_at, self.probing = n_generated + length, False
        self.marks.clear()
        self.marks.append((n_generated, self.clock()))
        self._sent.clear()
        self._clean, self._own = [], 0
        return f"{why}: pause for {length} tokens"

    def _measure_pause(self) -> None:
        """Plain decoding's seconds per token from the pause that ends: the median round trip
        of its clean runs; without any, its time per token from its second arrival on (the
        first may still come from a speculative run sent before it)."""
        if self._clean:
            figure = statistics.median_high(self._clean)
        else:
            marks = list(self.marks)[1:]
            if len(marks) < 2 or marks[-1][0] == marks[0][0]:
                return
            figure = (marks[-1][1] - marks[0][1]) / (marks[-1][0] - marks[0][0])
        self.plain_s = figure if self.plain_s is None else (
            SMOOTHING * figure + (1 - SMOOTHING) * self.plain_s)


def _error(marks) -> float:
    """The standard error of the seconds per token over `marks` ((tokens, time) at each
    arrival): tokens come in bursts, so it is a ratio's (time over tokens, arrival by
    arrival); 0 with fewer than two arrivals to compare."""
    points = list(marks)
    gaps = [(b[1] - a[1], b[0] - a[0]) for a, b in zip(points, points[1:]) if b[0] > a[0]]
    m = len(gaps)
    if m < 2:
        return 0.0
    seconds, count = sum(g[0] for g in gaps), sum(g[1] for g in gaps)
    ratio = seconds / count
    spread = sum((t - ratio * n) ** 2 for t, n in gaps) / (m - 1)
    return math.sqrt(spread / m) / (count / m)
