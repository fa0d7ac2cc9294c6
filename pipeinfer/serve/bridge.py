"""Between the thread that takes the front's messages (link.py, intake.py) and the head's
loop (the main thread, the only one that touches MPI): requests go in through a bounded
thread-safe queue as tickets, one per choice; each ticket's events go back through its sink.

A failure of the whole job (a rank failed, or the launcher is ending it) is one message to
the front (`lost`), which resumes the requests on a new job or, without failover, answers
them with the reason.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..api.errors import ApiError
from ..config.serving import OFF
from ..model.sampling import SamplingParams

_ids = itertools.count()


@dataclass(eq=False)   # (compared and hashed as itself: Bridge.running is a set)
class Ticket:
    """One request crossing into the head: its prompt tokens and settings, and the way back
    (`sink`: (choice, event) to its handler, from the head's thread)."""
    prompt: list[int]
    n_predict: int
    sampling: SamplingParams
    stop: tuple[str, ...]
    sink: Callable[[int, Any], None]
    logprobs: int | None = None     # None: not asked; else how many top tokens with each
    ignore_eos: bool = False
    index: int = 0                  # its choice in the request (n, several prompts)
    cache: str = OFF                # what of a prefix a slot keeps it may reuse (prompt_cache)
    preserve: frozenset[int] = frozenset()   # special tokens whose text the answer keeps
    constraint: Any = None          # its grammar's state (model/grammar.py), if any
    resumed: tuple[int, ...] = ()   # tokens it sent before its job ended (a resumed request)
    inputs: tuple[tuple[int, ...], ...] = ()   # an embedding request's inputs (no generation)
    pooling: str = ""               # and how its tokens' states become a vector
    keep: int = 0                   # the key its ranks keep its cells under (0: none)
    cancelled: threading.Event = field(default_factory=threading.Event)
    arrived: float = field(default_factory=time.perf_counter)
    number: int = field(default_factory=lambda: next(_ids))

    def send(self, event) -> None:
        """From the head's thread: hand an event to the request's handler."""
        self.sink(self.index, event)


class Bridge:
    def __init__(self, max_waiting: int, lost: Callable[[str], None] = lambda message: None):
        self._waiting: queue.Queue[Ticket] = queue.Queue(maxsize=max_waiting)
        self._held: Ticket | None = None   # taken by the head, not started: it goes first
        self.max_waiting = max_waiting
        self.running: set[Ticket] = set()  # being generated (the head's thread changes it)
        self.lost = lost                   # the job is ending: why, to the front
        self.failure = ""

    @property
    def depth(self) -> int:
        """Requests waiting for the head (not the ones it is generating)."""
        return self._waiting.qsize() + (self._held is not None)

    def submit_all(self, tickets: list[Ticket]) -> None:
        """Queue a request's tickets, all or none (ApiError 503 when they do not fit or the
        job is ending)."""
        for i, ticket in enumerate(tickets):
            try:
                if self.failure:
                    raise ApiError(503, f"the server has failed: {self.failure}")
                self._waiting.put_nowait(ticket)
            except (ApiError, queue.Full) as err:
                for queued in tickets[:i]:
                    queued.cancelled.set()   # (take() skips them)
                if isinstance(err, ApiError):
                    raise
                raise ApiError(503, f"the server is busy: {self.max_waiting} requests are "
                                    "waiting already; try again later") from None

    def take(self, timeout: float) -> Ticket | None:
        """From the head: the next request not cancelled, waiting up to `timeout` seconds
        (0: only one already waiting)."""
        held, self._held = self._held, None
        if held is not None and not held.cancelled.is_set():
            return held
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                ticket = (self._waiting.get(timeout=left) if left > 0
                          else self._waiting.get_nowait())
            except queue.Empty:
                return None
            if not ticket.cancelled.is_set():
                return ticket

    def hold(self, ticket: Ticket) -> None:
        """From the head: `ticket`, just taken, cannot start yet; `take` gives it first."""
        self._held = ticket

    def fail(self, message: str) -> None:
        """The job is ending: new requests are refused, and the front is told once."""
        if not self.failure:
            self.failure = message
            self.lost(message)
