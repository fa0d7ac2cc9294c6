"""The front's requests: each one's body (with the seed the front drew if it had none), the
tokens each of its choices has sent its client, which choices have ended, and the way to its
handler. Everything here runs on the front's event loop.

A request is sent to the job that is up (`start`); when that job ends before the request
does, the request is sent again to the next job with its tokens so far, and goes on from them
(the client's stream pauses, nothing is repeated or lost). Calls (tokenize, detokenize, the
job's metrics) are answered by the job that is up, or refused while none is. Each token's
arrival is timed (the metrics' time to first token and inter-token latency) and told to the
console (console.py)."""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..api.errors import ApiError
from ..api.events import Done, Embedded, Failed, Piece

Send = Callable[[tuple], bool]   # to the job that is up; False when none is


@dataclass(eq=False)
class Pending:
    rid: int
    kind: str                   # "chat", "completions" or "embeddings"
    body: dict
    tokens: dict[int, list[int]] = field(default_factory=dict)   # choice -> tokens sent
    done: set[int] = field(default_factory=set)
    ask: Any = None             # the job's api.Ask, once it accepted the request
    accepted: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop()
                                     .create_future())
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    arrived: float = field(default_factory=time.monotonic)
    resumed: int = 0            # times it was sent again to a new job
    job: int = -1               # the job it was last sent to
    last_token: dict[int, float] = field(default_factory=dict)   # choice -> when

    @property
    def finished(self) -> bool:
        return self.ask is not None and len(self.done) == self.ask.n_choices


class Table:
    def __init__(self, limit: int, metrics=None,
                 on_resumed: Callable[["Pending"], None] = lambda request: None,
                 console=None):
        self.limit, self.metrics = limit, metrics   # (front/metrics.ServiceMetrics)
        self.console = console   # (front/console.Console: each token's arrival)
        self.requests: dict[int, Pending] = {}   # in arrival order
        self.calls: dict[int, asyncio.Future] = {}
        self._ids = itertools.count(1)
        self.on_resumed = on_resumed

    def add(self, kind: str, body: dict, send: Send, job: int) -> Pending:
        """A new request, sent at once if a job is up (`job` >= 0), else when one is;
        503 with Retry-After when `limit` requests are under way or waiting already."""
        if len(self.requests) >= self.limit:
            raise ApiError(503, f"the server is busy: {self.limit} requests are under way or "
                                "waiting already; try again later",
                           headers={"Retry-After": "5"})
        request = Pending(next(self._ids), kind, body)
        self.requests[request.rid] = request
        if job >= 0:
            self._send(request, send, job)
        return request

    def _send(self, request: Pending, send: Send, job: int) -> None:
        tokens = [request.tokens.get(i, []) for i in range(max(request.tokens, default=-1) + 1)]
        resumed = request.job >= 0 and request.job != job
        request.job = job
        if resumed:
            request.resumed += 1
            self.on_resumed(request)
        send(("start", request.rid, request.kind, request.body, tokens, set(request.done)))

    def resend(self, send: Send, job: int) -> int:
        """Every request under way or waiting to a job that is now up; how many resume."""
        resuming = sum(1 for r in self.requests.values() if r.job >= 0 and r.job != job)
        for request in list(self.requests.values()):
            self._send(request, send, job)
        return resuming

    def cancel(self, rid: int, send: Send) -> None:
        """Its client went away: forgotten here, cancelled in the job."""
        if self.requests.pop(rid, None) is not None:
            send(("cancel", rid))

    def call(self, name: str, body: dict, send: Send) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        rid = next(self._ids)
        self.calls[rid] = future
        if not send(("call", rid, name, body)):
            self.calls.pop(rid)
            future.set_exception(ApiError(503, "the server is recovering; try again later",
                                          headers={"Retry-After": "5"}))
        return future

    def fail_calls(self) -> None:
        """The job ended: calls it had not answered get 503."""
        for future in self.calls.values():
            if not future.done():
                future.set_exception(ApiError(503, "the server is recovering; try again "
                                                   "later", headers={"Retry-After": "5"}))
        self.calls.clear()

    def fail_all(self, status: int, message: str) -> None:
        """Every request ends with an error (the front gives up, or stops)."""
        for request in self.requests.values():
            error = ApiError(status, message)
            if not request.accepted.done():
                request.accepted.set_exception(error)
            else:
                request.events.put_nowait((0, Failed(status, message)))
        self.requests.clear()

    def receive(self, message: tuple) -> None:
        """A message from the job that is up."""
        kind, rid = message[0], message[1]
        if kind == "answer":
            future = self.calls.pop(rid, None)
            if future is not None and not future.done():
                future.set_result(message[2])
            return
        if kind == "refused":
            self._refused(rid, ApiError(message[2], message[3], message[4], message[5]))
            return
        request = self.requests.get(rid)
        if request is None:
            return   # cancelled meanwhile
        if kind == "accepted":
            request.ask = message[2]
            if not request.accepted.done():
                request.accepted.set_result(message[2])
        elif kind == "event":
            self._event(request, message[2], message[3])

    def _refused(self, rid: int, error: ApiError) -> None:
        future = self.calls.pop(rid, None)
        if future is not None:
            if not future.done():
                future.set_exception(error)
            return
        if error.status == 503:   # the job is ending: the request waits for the next one
            return
        request = self.requests.pop(rid, None)
        if request is None:
            return
        if not request.accepted.done():
            request.accepted.set_exception(error)
        else:
            request.events.put_nowait((0, Failed(error.status, error.message)))

    def _event(self, request: Pending, index: int, event) -> None:
        if isinstance(event, Piece) and event.token is not None:
            request.tokens.setdefault(index, []).append(event.token)
            self._latency(request, index)
        elif isinstance(event, (Done, Embedded, Failed)):
            request.done.add(index)
            if request.finished or isinstance(event, Failed):
                self.requests.pop(request.rid, None)
        request.events.put_nowait((index, event))

    def _latency(self, request: Pending, index: int) -> None:
        """A choice's token arrived: its time to first token, or the gap since its last."""
        now = time.monotonic()
        last = request.last_token.get(index)
        request.last_token[index] = now
        seconds = now - (request.arrived if last is None else last)
        if self.metrics is not None:
            (self.metrics.ttft if last is None else self.metrics.itl).observe(seconds)
        if self.console is not None:
            self.console.token(request.rid, seconds, first=last is None)
