"""The job's intake of the front's messages (link.py), on the link's thread: a request is
parsed and checked with the model at hand (api/requests.py, prepare.py), answered "accepted"
or "refused", and its tickets go to the head through the bridge; each ticket's events go
back to the front as they come. A cancel marks a request's tickets (the head cancels their
generations at its next turn); a call (tokenize, detokenize, metrics) is answered at once."""

from __future__ import annotations

from ..api import embeddings, requests as api, text as text_api
from ..api.errors import ApiError
from ..api.events import Done, Failed
from ..config.job import JobConfig
from ..config.serving import EXACT, OFF, ServeConfig
from . import prepare
from .bridge import Bridge, Ticket
from .link import FrontLink
from .stats import JobStats

JOB_QUEUE = 4096   # the front holds the waiting requests (its --queue); the job takes them all


class Intake:
    def __init__(self, link: FrontLink, served: ServeConfig, job: JobConfig, head,
                 bridge: Bridge, stats: JobStats):
        self.link, self.served, self.job, self.head = link, served, job, head
        self.bridge, self.stats = bridge, stats
        self._requests: dict[int, list[Ticket]] = {}   # rid -> its tickets

    def handle(self, message: tuple) -> None:
        kind, rid = message[0], message[1]
        try:
            if kind == "start":
                self._start(rid, *message[2:])
            elif kind == "cancel":
                for ticket in self._requests.pop(rid, ()):
                    ticket.cancelled.set()
            elif kind == "call":
                self.link.send(("answer", rid, self._call(*message[2:])))
        except ApiError as err:
            self.link.send(("refused", rid, err.status, err.message, err.kind, err.param))

    def _start(self, rid: int, kind: str, body: dict, resumed: list, done: set) -> None:
        if kind == "embeddings":
            self._start_embeddings(rid, body)
            return
        served, tokenizer = self.served, self.head.tokenizer
        parse = api.parse_chat if kind == "chat" else api.parse_completion
        ask = parse(body, served.defaults, served.cache_prompt != OFF)
        prepare.check(ask, tokenizer, served.model_name, self.job.slots)
        ask = prepare.with_tools(ask, tokenizer)
        left = [ask.n_choices - len(done)]

        def sink(index: int, event) -> None:
            self.link.send(("event", rid, index, event))
            if isinstance(event, (Done, Failed)):
                left[0] -= 1
                if left[0] == 0:
                    self._requests.pop(rid, None)

        tickets = [t for t in prepare.tickets(ask, tokenizer, self.job.n_ctx, sink, resumed,
                                              self.cache_mode) if t.index not in done]
        for ticket in tickets:   # (under a front, its ranks keep its cells under this key)
            ticket.keep = keep_key(rid, ticket.index)
        self._submit(rid, ask, tickets)

    @property
    def cache_mode(self) -> str:
        """What a request that asks to reuse a kept prefix may reuse: the server's mode, or
        the exact one where the server reuses nothing unless asked."""
        mode = self.served.cache_prompt
        return EXACT if mode == OFF else mode

    def _start_embeddings(self, rid: int, body: dict) -> None:
        """An embedding request (done again from the start if it is resumed)."""
        ask = embeddings.parse(body)
        api.check_model(ask.model, self.served.model_name)

        def sink(index: int, event) -> None:
            self.link.send(("event", rid, index, event))
            self._requests.pop(rid, None)

        ticket = prepare.embedding_ticket(ask, self.head.tokenizer, self.job.n_ctx, sink)
        self._submit(rid, ask, [ticket])

    def _submit(self, rid: int, ask, tickets: list[Ticket]) -> None:
        self._requests[rid] = tickets
        self.link.send(("accepted", rid, ask))   # (before any of its events)
        self.bridge.submit_all(tickets)   # (refused, 503, when the job is ending)

    def _call(self, name: str, body: dict):
        if name == "tokenize":
            return text_api.tokenize(self.head.tokenizer, body)
        if name == "detokenize":
            return text_api.detokenize(self.head.tokenizer, body)
        if name == "metrics":
            return self.totals()
        raise ApiError(404, f"no such call: {name}")

    def totals(self) -> dict:
        """The job's totals now (serve/stats.py), the head's own busy seconds with them."""
        self.stats.busy_s[0] = self.head.setup.pipeline.busy_s
        return self.stats.snapshot(self.bridge.depth, len(self.bridge.running))


def open_intake(link: FrontLink, served: ServeConfig, job: JobConfig,
                head) -> tuple[Bridge, JobStats]:
    """The job's end of the service: the bridge the head takes requests from and the counts
    it keeps, with the front's messages taken (intake.py, on the link's thread), the counts
    sent to the front after every generation and the head's pulses (pulse.py) as they come."""
    stats = JobStats()
    bridge = Bridge(JOB_QUEUE, lost=lambda message: link.send(("lost", message)))
    intake = Intake(link, served, job, head, bridge, stats)
    stats.on_change = lambda: link.send(("stats", intake.totals()))
    stats.on_pulse = lambda pulse: link.send(("pulse", pulse))
    link.listen(intake.handle)
    return bridge, stats


def keep_key(rid: int, choice: int) -> int:
    """A request choice's key for its kept cells (engine/head/kept.py): positive, in 31 bits
    (it travels in a KvOp), the same on every job of one front."""
    return ((rid << 8 | choice) & 0x7FFFFFFF) or 1
