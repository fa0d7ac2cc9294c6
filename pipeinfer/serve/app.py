"""The ASGI app of `pipeinfer serve` (Starlette): OpenAI-style completions and chat
completions (streamed as server-sent events or whole), embeddings, models, tokenize /
detokenize, health and metrics, with CORS.

Handlers run on the HTTP thread's event loop. They check and tokenize a request there (so a
bad one is answered at once, not after the requests before it), hand its tickets (one per
choice) to the head through the bridge, and wait on the request's own queue for their text.
A client that goes away (a failed write, or a disconnect noticed while waiting) cancels its
tickets, and the head cancels the generations at their next token.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from ..model.sampling import SamplingParams
from ..api import embeddings, requests as api, text as text_api
from ..front import http as http_common
from . import prepare
from .bridge import Bridge, State, Ticket
from ..front.http import QueueChoices, metric_counter, read_body
from .metrics import ServeMetrics
from ..api.responses import Reply

log = logging.getLogger(__name__)



@dataclass
class Service:
    """What the handlers share; `head` is set once the job has started."""
    bridge: Bridge
    metrics: ServeMetrics
    model_name: str
    n_ctx: int
    defaults: SamplingParams
    api_key: str | None = None
    slots: int = 1             # requests generated at once (--parallel)
    cache_prompt: bool = True  # what a request that does not say cache_prompt gets
    head: Any = None
    created: int = 0


def build_app(service: Service, cors_origins: tuple[str, ...] = ("*",)) -> Starlette:
    """The app (routes and their checks: http_common.build)."""
    handlers = {"completions": _completions, "chat": _chat, "embeddings": _embeddings,
                "models": _models,
                "one_model": _one_model, "health": _health, "metrics": _metrics,
                "tokenize": _tokenize, "detokenize": _detokenize}
    return http_common.build(service, handlers, service.api_key, metric_counter(service.metrics),
                             cors_origins)


async def _completions(service: Service, request: Request) -> Response:
    return await _complete(service, request, chat=False)


async def _chat(service: Service, request: Request) -> Response:
    return await _complete(service, request, chat=True)


async def _embeddings(service: Service, request: Request) -> Response:
    ask = embeddings.parse(api.parse_body(await read_body(request)))
    service.bridge.check_ready()
    api.check_model(ask.model, service.model_name)
    tickets: list[Ticket] = []
    choices = QueueChoices(request, lambda: [t.cancelled.set() for t in tickets])
    tickets.append(embeddings.ticket(ask, service.head.tokenizer, service.n_ctx,
                                     choices.sink()))
    service.bridge.submit_all(tickets)
    return await http_common.embedded(choices, ask, service.model_name)


async def _models(service: Service, request: Request) -> Response:
    return JSONResponse({"object": "list", "data": [_model(service)]})


async def _one_model(service: Service, request: Request) -> Response:
    api.check_model(request.path_params["model"], service.model_name)
    return JSONResponse(_model(service))


async def _health(service: Service, request: Request) -> Response:
    service.bridge.check_ready()
    return JSONResponse({"status": "ok"})


async def _metrics(service: Service, request: Request) -> Response:
    head, bridge = service.head, service.bridge
    busy = head.setup.pipeline.busy_s if head is not None else None
    body = service.metrics.render(bridge.depth, len(bridge.running), busy)
    return Response(body, media_type=service.metrics.content_type)


async def _tokenize(service: Service, request: Request) -> Response:
    service.bridge.check_ready()
    body = api.parse_body(await read_body(request))
    return JSONResponse(text_api.tokenize(service.head.tokenizer, body))


async def _detokenize(service: Service, request: Request) -> Response:
    service.bridge.check_ready()
    body = api.parse_body(await read_body(request))
    return JSONResponse(text_api.detokenize(service.head.tokenizer, body))


def _model(service: Service) -> dict:
    return {"id": service.model_name, "object": "model", "created": service.created,
            "owned_by": "pipeinfer", "meta": {"n_ctx": service.n_ctx}}


async def _complete(service: Service, request: Request, chat: bool) -> Response:
    body = api.parse_body(await read_body(request))
    defaults = service.defaults
    parse = api.parse_chat if chat else api.parse_completion
    ask = parse(body, defaults, service.cache_prompt)
    service.bridge.check_ready()
    prepare.check(ask, service.head.tokenizer, service.model_name, service.slots)
    ask = prepare.with_tools(ask, service.head.tokenizer)
    tickets: list[Ticket] = []
    choices = QueueChoices(request, lambda: [t.cancelled.set() for t in tickets])
    tickets += prepare.tickets(ask, service.head.tokenizer, service.n_ctx, choices.sink())
    service.bridge.submit_all(tickets)
    reply = Reply(ask, service.model_name, tickets[0].number)
    if ask.stream:
        return StreamingResponse(http_common.events(choices, reply),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    return await http_common.whole(choices, reply)


def ready(service: Service, head) -> None:
    """The job has started: requests are taken from now on."""
    service.head = head
    service.created = int(time.time())
    service.bridge.state = State.READY
