"""The job's end of the channel to the front (`pipeinfer serve --ranks N`: front/), on rank 0.

The front owns the HTTP server and every request's state; the job keeps what needs the model
and MPI: the tokenizer and chat template, the grammars, the lanes. Messages are pickled
tuples over multiprocessing.connection (length-framed, the peer authenticated with the key
the front put in the job's environment):

    front -> job   ("start", rid, kind, body, resumed, done)   a request (kind: "chat",
                                       "completions" or "embeddings"); `resumed[i]`: the
                                       tokens choice i already sent, `done`: choices ended
                   ("cancel", rid)     its client went away
                   ("call", rid, name, body)   tokenize / detokenize / metrics
                   ("stop",)           end the job in order
    job -> front   ("hello", pid, job, host) at once, ("ready", info) once the model is loaded
                   ("beat", n)         the pipeline worked (n: runs evaluated on the head
                                       and results taken so far): at most every BEAT_S
                                       while it does, so that a slow job (a long prefill)
                                       is not taken for a hung one by the front's watchdog
                                       (--stall-timeout); a stopped rank returns nothing,
                                       the runs in flight reach their cap, and the beats stop
                   ("accepted", rid, ask) or ("refused", rid, status, message, kind, param)
                   ("event", rid, choice, Piece | Done | Embedded | Failed)
                   ("answer", rid, result) or ("refused", rid, ...) for a call
                   ("lost", message)   the job is ending (a rank failed): the front resumes
                                       its requests on a new one

Messages are taken on a thread of their own; events are sent from the head's thread.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from multiprocessing.connection import Client, Connection

from ..api import embeddings, requests as api, text as text_api
from . import prepare
from ..api.requests import ApiError
from .bridge import Done, Failed

log = logging.getLogger(__name__)

KEY_ENV = "PIPEINFER_FRONT_KEY"   # the channel's key (hex), from the front
JOB_ENV = "PIPEINFER_FRONT_JOB"   # which of the front's launches this job is
BEAT_S = 0.5                      # at most one beat this often


class FrontLink:
    def __init__(self, address: str):
        key = bytes.fromhex(os.environ.get(KEY_ENV, ""))
        family = "AF_UNIX" if address.startswith("/") else "AF_INET"
        target = address if family == "AF_UNIX" else _host_port(address)
        self.conn: Connection = Client(target, family=family, authkey=key)
        self._lock = threading.Lock()
        self.closed = threading.Event()   # the front went away or asked to stop
        self.service = None
        self._requests: dict[int, list] = {}   # rid -> its tickets
        self._beat = (0, 0.0)   # results counted at the last beat, and when
        self.send(("hello", os.getpid(), int(os.environ.get(JOB_ENV, "0")),
                   socket.gethostname()))

    def send(self, message: tuple) -> None:
        with self._lock:
            try:
                self.conn.send(message)
            except (OSError, ValueError):   # the front is gone: the job ends (closed)
                self.closed.set()

    def serve(self, service) -> None:
        """Take the front's messages for `service` (app.Service) on a thread of its own;
        lost job-wide failures go to the front as one message."""
        self.service = service
        service.bridge.lost = lambda message: self.send(("lost", message))
        threading.Thread(target=self._receive, name="front", daemon=True).start()

    def _receive(self) -> None:
        try:
            while True:
                message = self.conn.recv()
                if message[0] == "stop":
                    break
                self._handle(message)
        except (EOFError, OSError):
            log.info("the front closed the channel: ending the job")
        except Exception as err:  # a bug: end the job rather than leave the front waiting
            log.error("front channel: %r", err, exc_info=err)
        self.closed.set()

    def _handle(self, message: tuple) -> None:
        kind, rid = message[0], message[1]
        try:
            if kind == "start":
                self._start(rid, *message[2:])
            elif kind == "cancel":
                for ticket in self._requests.pop(rid, ()):
                    ticket.cancelled.set()
            elif kind == "call":
                self.send(("answer", rid, self._call(*message[2:])))
        except ApiError as err:
            self.send(("refused", rid, err.status, err.message, err.kind, err.param))

    def _start(self, rid: int, kind: str, body: dict, resumed: list, done: set) -> None:
        service = self.service
        if kind == "embeddings":
            self._start_embeddings(rid, body)
            return
        parse = api.parse_chat if kind == "chat" else api.parse_completion
        ask = parse(body, service.defaults, service.cache_prompt)
        tokenizer = service.head.tokenizer
        prepare.check(ask, tokenizer, service.model_name, service.slots)
        ask = prepare.with_tools(ask, tokenizer)
        left = [ask.n_choices - len(done)]

        def sink(index: int, event) -> None:
            self.send(("event", rid, index, event))
            if isinstance(event, (Done, Failed)):
                left[0] -= 1
                if left[0] == 0:
                    self._requests.pop(rid, None)

        tickets = [t for t in prepare.tickets(ask, tokenizer, service.n_ctx, sink, resumed)
                   if t.index not in done]
        self._requests[rid] = tickets
        self.send(("accepted", rid, ask))
        service.bridge.submit_all(tickets)

    def _start_embeddings(self, rid: int, body: dict) -> None:
        """An embedding request (done again from the start if it is resumed)."""
        service = self.service
        ask = embeddings.parse(body)
        api.check_model(ask.model, service.model_name)

        def sink(index: int, event) -> None:
            self.send(("event", rid, index, event))
            self._requests.pop(rid, None)

        ticket = embeddings.ticket(ask, service.head.tokenizer, service.n_ctx, sink)
        self._requests[rid] = [ticket]
        self.send(("accepted", rid, ask))
        service.bridge.submit_all([ticket])

    def _call(self, name: str, body: dict):
        service = self.service
        if name == "tokenize":
            return text_api.tokenize(service.head.tokenizer, body)
        if name == "detokenize":
            return text_api.detokenize(service.head.tokenizer, body)
        bridge, head = service.bridge, service.head
        return service.metrics.render(bridge.depth, len(bridge.running),
                                      head.setup.pipeline.busy_s)

    def ready(self, service, statuses) -> None:
        self.send(("ready", {"statuses": [list(s[:3]) for s in statuses],
                             "slots": service.slots, "n_ctx": service.n_ctx}))

    def alive(self) -> bool:
        return not self.closed.is_set()

    def beat(self, progress: int) -> None:
        """After each run the head's pipeline evaluated or took back (Pipeline.on_progress,
        on the head's thread; a clock read): a beat to the front if BEAT_S has passed."""
        now = time.monotonic()
        if now - self._beat[1] >= BEAT_S:
            self._beat = (progress, now)
            self.send(("beat", progress))

    def close(self) -> None:
        self.closed.set()
        try:
            self.conn.close()
        except OSError:
            pass


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)
