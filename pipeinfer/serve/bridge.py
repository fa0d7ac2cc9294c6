"""Between the HTTP server's event loop (a thread of its own) and the head's loop (the main
thread, the only one that touches MPI): requests go in through a bounded thread-safe queue,
and each request's events come back on its own asyncio queue (loop.call_soon_threadsafe).

The server's state (loading, ready, failed, stopping) lives here too, since both sides read
it: requests are refused with 503 unless it is ready.
"""

from __future__ import annotations

import enum
import itertools
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..model.sampling import SamplingParams
from ..api.requests import ApiError
from ..api.logprobs import TokenLogprob


class State(enum.Enum):
    LOADING = "loading model"
    READY = "ok"
    FAILED = "failed"
    STOPPING = "shutting down"


@dataclass(frozen=True)
class Piece:
    """Text of the completion (maybe empty while a stop string is possible), the number of
    tokens it took (`token`: the one, when it took one), and their logprobs if the request
    asked for them."""
    text: str
    n_tokens: int
    logprobs: tuple[TokenLogprob, ...] = ()
    token: int | None = None


@dataclass(frozen=True)
class Done:
    """The completion ended: finish_reason "stop" or "length", and the token counts
    (`cached_tokens`: the prompt's prefix reused from its slot, not evaluated again); `text`:
    the answer's last text, held back until the end (one event with the end, so an answer
    resumed after a failure never gets it twice)."""
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    text: str = ""


@dataclass(frozen=True)
class Embedded:
    """An embedding request's answer: each input's vector (float32), and the tokens of all
    its inputs."""
    vectors: tuple
    prompt_tokens: int


@dataclass(frozen=True)
class Failed:
    """The request could not be completed (ApiError's fields)."""
    status: int
    message: str


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
    cache_prompt: bool = True       # reuse a prefix its slot keeps (prompt_cache.py)
    preserve: frozenset[int] = frozenset()   # special tokens whose text the answer keeps
    constraint: Any = None          # its grammar's state (model/grammar.py), if any
    resumed: tuple[int, ...] = ()   # tokens it sent before its job ended (front_link.py)
    inputs: tuple[tuple[int, ...], ...] = ()   # an embedding request's inputs (no generation)
    pooling: str = ""               # and how its tokens' states become a vector
    cancelled: threading.Event = field(default_factory=threading.Event)
    arrived: float = field(default_factory=time.perf_counter)
    number: int = field(default_factory=lambda: next(_ids))

    def send(self, event) -> None:
        """From the head's thread: hand an event to the request's handler."""
        self.sink(self.index, event)


class Bridge:
    def __init__(self, max_waiting: int):
        self._waiting: queue.Queue[Ticket] = queue.Queue(maxsize=max_waiting)
        self.max_waiting = max_waiting
        self.state = State.LOADING
        self.failure = ""               # why, when FAILED
        self.running: set[Ticket] = set()  # being generated (the head's thread changes it)
        # A front outside the job (front_link.py) resumes its requests on a new job instead:
        # a failure of the job is one message to it, not an error to each request.
        self.lost: Callable[[str], None] | None = None

    @property
    def depth(self) -> int:
        """Requests waiting for the head (not the one it is generating)."""
        return self._waiting.qsize()

    def check_ready(self) -> None:
        """ApiError 503 unless requests are taken now."""
        if self.state is State.FAILED:
            raise ApiError(503, f"the server has failed: {self.failure}")
        if self.state is not State.READY:
            raise ApiError(503, f"the server is {self.state.value}; try again later")

    def submit(self, ticket: Ticket) -> None:
        """From the event loop: queue a request (ApiError 503 when the queue is full)."""
        self.check_ready()
        try:
            self._waiting.put_nowait(ticket)
        except queue.Full:
            raise ApiError(503, f"the server is busy: {self.max_waiting} requests are "
                                "waiting already; try again later") from None

    def submit_all(self, tickets: list[Ticket]) -> None:
        """Queue a request's tickets, all or none (ApiError 503 when they do not fit)."""
        for i, ticket in enumerate(tickets):
            try:
                self.submit(ticket)
            except ApiError:
                for queued in tickets[:i]:
                    queued.cancelled.set()   # (take() skips them)
                raise

    def take(self, timeout: float) -> Ticket | None:
        """From the head: the next request not cancelled, waiting up to `timeout` seconds
        (0: only one already waiting)."""
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

    def fail(self, state: State, message: str, status: int = 503) -> None:
        """Refuse new requests from now on and end the running and waiting ones with
        `message`."""
        self.state, self.failure = state, message
        if self.lost is not None:
            if state is State.FAILED:
                self.lost(message)
            return
        tickets = list(self.running)
        while True:
            try:
                tickets.append(self._waiting.get_nowait())
            except queue.Empty:
                break
        for ticket in tickets:
            ticket.send(Failed(status, message))
