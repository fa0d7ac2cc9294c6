"""The head's side of `pipeinfer serve`, on the main thread (the only one touching MPI):
requests from the bridge are generated one at a time, in arrival order, each a generation of
the job's Head (which clears every rank's KV cells before the next one).

A request's tokens become text (whole UTF-8 characters), cut at its first stop string, and go
back to its handler as they are accepted. A request whose client went away (its ticket is
cancelled) is cancelled at its next token: the generator is closed, which cancels the runs in
flight and drains the pipeline, so the next request starts clean.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from ..engine.job import Head, describe
from ..model.tokenizer import TextStream
from .bridge import Bridge, Done, Piece, State, Ticket
from .metrics import ServeMetrics
from .stop_text import StopText

log = logging.getLogger(__name__)

IDLE_WAIT_S = 0.05   # how long the head waits for a request before looking at the ranks
FINISH_REASONS = {"eos": "stop", "cancelled": "stop"}   # the rest: "length"


def serve_requests(head: Head, bridge: Bridge, metrics: ServeMetrics,
                   keep_going: Callable[[], bool]) -> None:
    """Generate the bridge's requests while `keep_going()`. When a generation fails (a rank
    failed: RankFailed names it), every request under way or waiting is answered 503 with the
    reason, new ones are refused, and the error goes to the caller, which ends the job."""
    try:
        while keep_going():
            ticket = bridge.take(IDLE_WAIT_S)
            if ticket is None:
                head.check_ranks()  # a worker's failure is reported even while idle
                continue
            bridge.running = ticket  # until it is done: a failure answers it too
            generate(head, ticket, metrics)
            bridge.running = None
    except Exception as err:  # every request under way and waiting gets 503 with why
        bridge.fail(State.FAILED, describe(err))
        raise


def generate(head: Head, ticket: Ticket, metrics: ServeMetrics) -> None:
    """One request from its first token to Done (or a cancellation, which sends nothing)."""
    request = head.request(ticket.prompt, ticket.n_predict, ignore_eos=False)
    text, stops = TextStream(head.tokenizer), StopText(ticket.stop)
    tokens = head.stream(request, ticket.sampling)
    n_tokens, last = 0, None
    try:
        for token in tokens:
            now = time.perf_counter()
            if last is None:
                metrics.ttft.observe(now - ticket.arrived)
            else:
                metrics.itl.observe(now - last)
            n_tokens, last = n_tokens + 1, now
            piece = stops.push(text.push(token))
            if piece or not stops.stopped:
                ticket.send(Piece(piece, 1))
            if stops.stopped or ticket.cancelled.is_set():
                break
    finally:
        tokens.close()  # left early: cancels the generation and drains its runs
    gen = head.gen
    metrics.generation(len(ticket.prompt), n_tokens, gen.counters)
    if ticket.cancelled.is_set():
        metrics.cancelled.inc()
        log.info("request %d cancelled by its client after %d tokens", ticket.number,
                 n_tokens)
        return
    rest = stops.push(text.finish()) + stops.finish()
    if rest:
        ticket.send(Piece(rest, 0))
    reason = "stop" if stops.stopped else FINISH_REASONS.get(gen.stop_reason, "length")
    ticket.send(Done(reason, len(ticket.prompt), n_tokens))
