"""The head's side of `pipeinfer serve`, on the main thread (the only one touching MPI):
requests from the bridge are generated up to --parallel at once, each in a lane of its own
(engine/head/lanes.py: a slot of every stage's contexts), through the one pipeline; more wait in
the bridge's queue, in arrival order.

A request's tokens become text (whole UTF-8 characters), cut at its first stop string, and go
back to its handler as they are accepted. A request whose client went away (its ticket is
cancelled) or that reached a stop string is cancelled at the next turn: its runs in flight are
drained and its slot cleared before another request takes it.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Callable

from ..engine.transport.backoff import IdleBackoff
from ..job.roles import Head, describe
from ..engine.head.lane import Lane
from ..engine.head.lanes import Lanes
from ..model.tokenizer import TextStream
from ..schedule.generation import Generation
from ..api.events import Done, Embedded, Piece
from .bridge import Bridge, Ticket
from ..api.logprobs import TokenLogprob, measure
from .pulse import BusyProbe, Pulse
from .stats import JobStats, answer_timings
from .stop_text import StopText

log = logging.getLogger(__name__)

IDLE_WAIT_S = 0.05   # how long the head waits for a request before looking at the ranks
FINISH_REASONS = {"eos": "stop", "cancelled": "stop"}   # the rest: "length"


class Completion:
    """One request's way from accepted tokens to its handler: text, stop strings, counts."""

    def __init__(self, ticket: Ticket, tokenizer, stats: JobStats):
        self.ticket, self.stats, self.tokenizer = ticket, stats, tokenizer
        self.text = TextStream(tokenizer, ticket.preserve)
        self.stops = StopText(ticket.stop)
        self.n_tokens = 0
        self.measured: deque[TokenLogprob] = deque()   # sampled, not yet accepted

    @property
    def wants_end(self) -> bool:
        """A stop string was reached, or the client went away."""
        return self.stops.stopped or self.ticket.cancelled.is_set()

    def observe(self, logits, token: int) -> None:
        """The sampler chose `token` from `logits` (its generated position's row)."""
        if self.ticket.logprobs is not None:
            self.measured.append(measure(logits, token, self.ticket.logprobs,
                                         self.tokenizer.piece))

    def _logprobs(self, token: int) -> tuple[TokenLogprob, ...]:
        while self.measured:
            entry = self.measured.popleft()
            if entry.token == token:
                return (entry,)
        return ()

    def on_token(self, token: int) -> None:
        entry = self._logprobs(token)
        if self.wants_end:
            return  # (tokens accepted with the one that completed a stop string)
        self.n_tokens += 1
        piece = self.stops.push(self.text.push(token))
        if piece or entry or not self.stops.stopped:
            self.ticket.send(Piece(piece, 1, entry, token))

    def replay(self, tokens: tuple[int, ...]) -> None:
        """Tokens its client already has (a request resumed on a new job): through the text
        and stop strings again, sending nothing, so the text goes on where it stopped."""
        for token in tokens:
            self.stops.push(self.text.push(token))
            if self.ticket.constraint is not None:
                self.ticket.constraint.accept(token)
        self.n_tokens = len(tokens)

    def ended_before(self, is_eog) -> str:
        """How a resumed request had ended already ("" if it had not): its tokens reached
        max_tokens, an end of generation or a stop string before its job ended."""
        tokens, ticket = self.ticket.resumed, self.ticket
        if self.stops.stopped:
            return "stop"
        if tokens and not ticket.ignore_eos and is_eog(tokens[-1]):
            return "eos"
        return "length" if len(tokens) >= ticket.n_predict else ""

    def finish(self, gen: Generation) -> None:
        """The generation ended and its runs are back: the rest of the text and Done (or,
        for a client gone, nothing)."""
        ticket = self.ticket
        if ticket.constraint is not None:
            ticket.constraint.close()
        cached = gen.request.cached
        self.stats.generation(len(ticket.prompt), self.n_tokens, gen.counters, cached)
        if ticket.cancelled.is_set():
            self.stats.cancelled += 1
            log.info("request %d cancelled by its client after %d tokens", ticket.number,
                     self.n_tokens)
            return
        # an answer cut inside a character (max_tokens): its incomplete bytes are left
        # out, streamed or whole, as llama-server does (no U+FFFD at the end)
        rest = self.stops.push(self.text.finish(keep_incomplete=False)) + self.stops.finish()
        reason = ("stop" if self.stops.stopped
                  else FINISH_REASONS.get(gen.stop_reason, "length"))
        log.info("request %d: done, %d tokens (%s)", ticket.number, self.n_tokens, reason)
        ticket.send(Done(reason, len(ticket.prompt), self.n_tokens, cached, rest,
                         answer_timings(gen, len(ticket.prompt), cached)))


class EmbeddingAnswer:
    """One embedding request's way back: its vectors once its runs are back."""

    def __init__(self, ticket: Ticket, stats: JobStats):
        self.ticket, self.stats = ticket, stats

    @property
    def wants_end(self) -> bool:
        return self.ticket.cancelled.is_set()

    def finish(self, job) -> None:
        """The job (engine/head/embedding_job.py) is done: its vectors to the handler."""
        if job.cancelled or self.wants_end:
            self.stats.cancelled += 1
            return
        n_tokens = sum(len(tokens) for tokens in self.ticket.inputs)
        self.ticket.send(Embedded(tuple(job.vectors()), n_tokens))


def serve_requests(head: Head, bridge: Bridge, stats: JobStats,
                   keep_going: Callable[[], bool], lanes: Lanes | None = None) -> None:
    """Generate the bridge's requests while `keep_going()`, in `lanes` (default: the head's
    slots). When a generation fails (a rank failed: RankFailed names it), the front is told
    why (bridge.fail: it resumes the requests on a new job, or answers them with the reason),
    new requests are refused, and the error goes to the caller, which ends the job."""
    lanes = lanes if lanes is not None else Lanes(head)
    pulse = Pulse(head, stats, bridge, lanes)
    backoff, probe = IdleBackoff(), BusyProbe(head, stats, pulse.send)
    try:
        while keep_going():
            probe.tick()
            _admit(lanes, head, bridge, stats)
            if not lanes.active:
                ticket = bridge.take(IDLE_WAIT_S)
                if ticket is None:
                    head.check_ranks()  # a worker's failure is reported even while idle
                else:
                    _start(lanes, head, bridge, stats, ticket)
                continue
            busy = lanes.turn()
            for lane in lanes.active:
                if lane.owner is not None and lane.owner.wants_end:
                    lanes.cancel(lane)
            for lane in lanes.reap():
                _end(lane, bridge)
            if not bridge.depth:
                lanes.refill_idle()
            if busy:
                backoff.reset()
            else:
                backoff.wait()
    except Exception as err:  # the front is told why, once
        bridge.fail(describe(err))
        raise
    finally:
        probe.drain()


def _admit(lanes: Lanes, head: Head, bridge: Bridge, stats: JobStats) -> None:
    """Waiting requests into the free slots. A request continuing the conversation a slot
    is refilling (engine/head/refill.py) takes that slot at once, behind the refill's runs.
    Other refills give way to a waiting request: they are cancelled, and it waits until
    their slots are back, since one may hold a longer prefix of its prompt."""
    while bridge.depth:
        ticket = bridge.take(0)
        if ticket is None:
            return
        if not lanes.continues(ticket.prompt, ticket.cache, bool(ticket.resumed)):
            if lanes.refilling or not lanes.n_free:
                lanes.stop_refills()
                bridge.hold(ticket)
                return
        _start(lanes, head, bridge, stats, ticket)


def _start(lanes: Lanes, head: Head, bridge: Bridge, stats: JobStats,
           ticket: Ticket) -> None:
    bridge.running.add(ticket)  # until it is done: a failure answers it too
    if ticket.inputs:
        lane = lanes.start_embedding([list(t) for t in ticket.inputs],
                                     EmbeddingAnswer(ticket, stats), ticket.pooling)
        log.info("request %d: embeddings of %d input(s), %d tokens, slot %d", ticket.number,
                 len(ticket.inputs), sum(len(t) for t in ticket.inputs), lane.slot)
        return
    completion = Completion(ticket, head.tokenizer, stats)
    if ticket.resumed:
        completion.replay(ticket.resumed)
        if (ended := completion.ended_before(head.tokenizer.is_eog)):
            completion.finish(Generation(head.request(ticket.prompt, ticket.n_predict),
                                         head.tokenizer.is_eog, stop_reason=ended))
            bridge.running.discard(ticket)
            return
    request = head.request(ticket.prompt, ticket.n_predict, ignore_eos=ticket.ignore_eos,
                           resumed=ticket.resumed)
    lane = lanes.start(request, ticket.sampling, completion, completion.on_token,
                       completion.observe, ticket.cache, ticket.constraint, ticket.keep)
    log.info("request %d: %d prompt tokens (%d kept in its slot)%s, slot %d, %s (%d under "
             "way)", ticket.number, len(ticket.prompt), lane.gen.request.cached,
             f", resumed after {len(ticket.resumed)} tokens" if ticket.resumed else "",
             lane.slot, lane.strategy, len(lanes.active))


def _end(lane: Lane, bridge: Bridge) -> None:
    completion: Completion | EmbeddingAnswer = lane.owner
    if lane.rooted_runs:
        log.info("request %d: %d of its runs carried its drafts behind its next token "
                 "(others under way)", completion.ticket.number, lane.rooted_runs)
    completion.finish(lane.gen)
    bridge.running.discard(completion.ticket)
