"""The ASGI app of `pipeinfer serve` (Starlette): OpenAI-style completions and chat
completions (streamed as server-sent events or whole), models, tokenize / detokenize, health
and metrics, with CORS.

Handlers run on the HTTP thread's event loop. They check and tokenize a request there (so a
bad one is answered at once, not after the requests before it), hand its tickets (one per
choice) to the head through the bridge, and wait on the request's own queue for their text.
A client that goes away (a failed write, or a disconnect noticed while waiting) cancels its
tickets, and the head cancels the generations at their next token.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from dataclasses import dataclass, replace
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..model.chat_template import ChatTemplateError
from ..model.grammar import GrammarError
from ..model.llama_lib import LlamaError
from ..model.sampling import SamplingParams
from . import api, text_api
from .api import ApiError, Ask
from .bridge import Bridge, Done, Failed, State, Ticket
from .metrics import ServeMetrics
from .responses import Reply
from .tool_calls import CLOSE, OPEN

log = logging.getLogger(__name__)

DISCONNECT_CHECK_S = 0.5   # how often a waiting handler looks whether its client is gone
PUBLIC = ("/health", "/v1/health")   # answered without the API key


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
    """The app; browsers from `cors_origins` may call it (CORS: a preflight OPTIONS is
    answered without the API key, answers carry Access-Control-Allow-Origin). The OpenAI
    routes answer with and without /v1, as llama-server's do."""
    def route(paths: tuple[str, ...], name: str, handler, method: str) -> list[Route]:
        async def bound(request: Request) -> Response:
            return await handler(service, request)
        return [Route(path, _guarded(service, name, bound), methods=[method])
                for path in paths]

    routes = [*route(("/v1/completions", "/completions"), "completions", _completions, "POST"),
              *route(("/v1/chat/completions", "/chat/completions"), "chat", _chat, "POST"),
              *route(("/v1/models", "/models"), "models", _models, "GET"),
              *route(("/v1/models/{model:path}", "/models/{model:path}"), "models", _one_model,
                     "GET"),
              *route(("/health", "/v1/health"), "health", _health, "GET"),
              *route(("/metrics",), "metrics", _metrics, "GET"),
              *route(("/tokenize",), "tokenize", _tokenize, "POST"),
              *route(("/detokenize",), "detokenize", _detokenize, "POST")]
    cors = Middleware(CORSMiddleware, allow_origins=list(cors_origins), allow_methods=["*"],
                      allow_headers=["*"], max_age=600)
    return Starlette(routes=routes, middleware=[cors],
                     exception_handlers={HTTPException: _http_error})


async def _completions(service: Service, request: Request) -> Response:
    return await _complete(service, request, chat=False)


async def _chat(service: Service, request: Request) -> Response:
    return await _complete(service, request, chat=True)


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
    body = api.parse_body(await _read_body(request))
    return JSONResponse(text_api.tokenize(service.head.tokenizer, body))


async def _detokenize(service: Service, request: Request) -> Response:
    service.bridge.check_ready()
    body = api.parse_body(await _read_body(request))
    return JSONResponse(text_api.detokenize(service.head.tokenizer, body))


def _model(service: Service) -> dict:
    return {"id": service.model_name, "object": "model", "created": service.created,
            "owned_by": "pipeinfer", "meta": {"n_ctx": service.n_ctx}}


def _guarded(service: Service, name: str, handler):
    """The handler behind the API key check, with ApiError as its error object, counted."""
    async def guarded(request: Request) -> Response:
        try:
            if service.api_key is not None and request.url.path not in PUBLIC:
                _check_key(request, service.api_key)
            response = await handler(request)
        except ApiError as err:
            response = JSONResponse(err.body(), status_code=err.status)
        except Exception as err:  # a bug: an error object all the same, the traceback logged
            log.error("%s: internal error: %r", request.url.path, err, exc_info=err)
            response = JSONResponse(ApiError(500, f"internal error: {err!r}").body(),
                                    status_code=500)
        service.metrics.requests.labels(endpoint=name, status=str(response.status_code)).inc()
        return response
    return guarded


def _check_key(request: Request, key: str) -> None:
    given = request.headers.get("authorization", "")
    scheme, _, token = given.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(),
                                                             key.encode()):
        raise ApiError(401, "invalid or missing API key (Authorization: Bearer KEY)"
                       if given else "missing API key (Authorization: Bearer KEY)")


async def _http_error(request: Request, exc: HTTPException) -> Response:
    """Starlette's own errors (no such route, wrong method) as error objects too."""
    message = {404: f"no such endpoint: {request.url.path}",
               405: f"{request.method} is not allowed on {request.url.path}"}.get(
        exc.status_code, str(exc.detail))
    return JSONResponse(ApiError(exc.status_code, message).body(), status_code=exc.status_code)


async def _read_body(request: Request) -> bytes:
    """The body, refused (413) once it grows past api.MAX_BODY."""
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > api.MAX_BODY:
        raise ApiError(413, f"the request body has {length} bytes, more than the "
                            f"{api.MAX_BODY} allowed")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > api.MAX_BODY:
            raise ApiError(413, f"the request body is larger than the {api.MAX_BODY} bytes "
                                "allowed")
        chunks.append(chunk)
    return b"".join(chunks)


def _prompt_tokens(service: Service, ask: Ask, prompt) -> list[int]:
    tokenizer = service.head.tokenizer
    if isinstance(prompt, tuple):
        text_api.check_tokens(prompt, tokenizer.n_vocab, "prompt")
        return list(prompt)
    if not ask.chat:
        return tokenizer.tokenize(prompt)
    context = dict(ask.template_kwargs)
    try:
        if ask.tools:
            _check_tool_template(tokenizer)
            context["tools"] = [dict(t) for t in ask.tools]
        return tokenizer.chat_tokens(ask.messages, **context)
    except (LlamaError, ChatTemplateError) as err:
        raise ApiError(400, f"cannot render the chat: {err}", param="messages") from None


def _check_tool_template(tokenizer) -> None:
    if "tools" not in tokenizer.chat_template().source:
        raise ApiError(400, "'tools': this model's chat template has no tool support (the "
                            "generic tool format needs constrained decoding, which this "
                            "server does not do yet)", param="tools")


def _preserved(tokenizer, ask: Ask) -> frozenset[int]:
    """Special tokens whose text the answer keeps (so its tool calls can be parsed)."""
    if not ask.tools:
        return frozenset()
    ids = [tokenizer.tokenize(mark, add_special=False) for mark in (OPEN, CLOSE)]
    return frozenset(t[0] for t in ids if len(t) == 1)


def _tickets(service: Service, ask: Ask) -> list[Ticket]:
    """One ticket per choice: each prompt's n choices (choice j's seed: the seed + j, so
    sampled choices differ), sharing one event queue."""
    events: asyncio.Queue = asyncio.Queue()
    loop, tickets = asyncio.get_running_loop(), []
    preserve = _preserved(service.head.tokenizer, ask)
    for prompt in ask.prompts or (None,):
        tokens = _prompt_tokens(service, ask, prompt)
        n_predict = api.n_predict(len(tokens), ask.max_tokens, service.n_ctx)
        for j in range(ask.n):
            sampling = replace(ask.sampling, seed=(ask.sampling.seed + j) % (1 << 64))
            tickets.append(Ticket(tokens, n_predict, sampling, ask.stop, loop, ask.logprobs,
                                  ask.ignore_eos, len(tickets), ask.cache_prompt, preserve,
                                  _grammar(service, ask), events))
    return tickets


def _grammar(service: Service, ask: Ask):
    """A fresh state of the request's grammar for one choice (400 if it does not parse)."""
    if ask.grammar is None:
        return None
    try:
        return service.head.tokenizer.grammar(ask.grammar)
    except GrammarError as err:
        raise ApiError(400, f"'{ask.grammar_param}': {err}", param=ask.grammar_param) \
            from None


async def _complete(service: Service, request: Request, chat: bool) -> Response:
    body = api.parse_body(await _read_body(request))
    defaults = service.defaults
    parse = api.parse_chat if chat else api.parse_completion
    ask = parse(body, defaults, service.cache_prompt)
    api.check_model(ask.model, service.model_name)
    api.check_choices(ask, service.slots)
    service.bridge.check_ready()
    text_api.check_tokens([t for t, _ in ask.sampling.logit_bias],
                          service.head.tokenizer.n_vocab, "logit_bias")
    tickets = _tickets(service, ask)
    service.bridge.submit_all(tickets)
    choices = Choices(tickets, request)
    reply = Reply(ask, service.model_name, tickets[0].number)
    if ask.stream:
        return StreamingResponse(_events(choices, reply), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    return await _whole(choices, reply)


class Choices:
    """A request's tickets, their one event queue, and its client."""

    def __init__(self, tickets: list[Ticket], request: Request):
        self.tickets, self.request = tickets, request
        self.events = tickets[0].events
        self.seen = time.monotonic()   # the client last seen connected

    def cancel(self) -> None:
        for ticket in self.tickets:   # (a no-op for the head once a generation is over)
            ticket.cancelled.set()

    async def next(self):
        """The next (choice, event); None once the client has gone (every ticket is then
        cancelled). Whether it has is looked at every DISCONNECT_CHECK_S, events or not."""
        while True:
            if time.monotonic() - self.seen > DISCONNECT_CHECK_S:
                self.seen = time.monotonic()
                if await self.request.is_disconnected():
                    self.cancel()
                    return None
            try:
                return await asyncio.wait_for(self.events.get(), DISCONNECT_CHECK_S)
            except asyncio.TimeoutError:
                continue


async def _whole(choices: Choices, reply: Reply) -> Response:
    try:
        while (got := await choices.next()) is not None:
            index, event = got
            if isinstance(event, Failed):
                raise ApiError(event.status, event.message)
            if isinstance(event, Done):
                reply.end(index, event)
                if reply.complete:
                    return JSONResponse(reply.whole())
            else:
                reply.add(index, event)
        return Response(status_code=499)  # nobody is there to read it
    finally:
        choices.cancel()


async def _events(choices: Choices, reply: Reply):
    """Server-sent events: the chunks, each choice's finish chunk, the usage chunk if asked,
    then [DONE]; an error object if a generation failed. Leaving early (client gone)
    cancels the tickets."""
    try:
        for chunk in reply.opening():
            yield _sse(chunk)
        while (got := await choices.next()) is not None:
            index, event = got
            if isinstance(event, Failed):
                yield _sse(ApiError(event.status, event.message).body())
                return
            if isinstance(event, Done):
                reply.end(index, event)
                for chunk in reply.finished(index):
                    yield _sse(chunk)
                if reply.complete:
                    for chunk in reply.closing():
                        yield _sse(chunk)
                    yield "data: [DONE]\n\n"
                    return
            elif (chunk := reply.chunk(index, event)) is not None:
                yield _sse(chunk)
    finally:
        choices.cancel()


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def ready(service: Service, head) -> None:
    """The job has started: requests are taken from now on."""
    service.head = head
    service.created = int(time.time())
    service.bridge.state = State.READY
