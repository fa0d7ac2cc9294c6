"""The HTTP plumbing under the handlers of app.py (Starlette; nothing of MPI or llama.cpp):
the routes with and without /v1 (and the console's: /ui, /api/status, /api/events), the API
key check (every path but /health and the console's page and files), CORS, error objects
for every failure, the request body's size limit, and a request's answer from its events:
whole, or as server-sent events. The events come from a request's `QueueChoices` (the table puts them on
its queue, whichever job sends them): `next()` gives (choice, event) or None once the client
has gone, `cancel()` ends its generations."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from typing import Awaitable, Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..api import embeddings, requests as api
from ..api.errors import ApiError
from ..api.events import Done, Embedded, Failed, Piece
from ..api.responses import Reply

log = logging.getLogger(__name__)

PUBLIC = ("/health", "/v1/health", "/", "/ui")   # answered without the API key
PUBLIC_UNDER = "/ui/"   # the console's files: its code, no data (page.py)
DISCONNECT_CHECK_S = 0.5   # how often a waiting handler looks whether its client is gone
Handler = Callable[[Request], Awaitable[Response]]

# (paths, name in the metrics, method) of every route, by the name of its handler
ROUTES = {"completions": (("/v1/completions", "/completions"), "completions", "POST"),
          "chat": (("/v1/chat/completions", "/chat/completions"), "chat", "POST"),
          "embeddings": (("/v1/embeddings", "/embeddings"), "embeddings", "POST"),
          "models": (("/v1/models", "/models"), "models", "GET"),
          "one_model": (("/v1/models/{model:path}", "/models/{model:path}"), "models", "GET"),
          "health": (("/health", "/v1/health"), "health", "GET"),
          "metrics": (("/metrics",), "metrics", "GET"),
          "tokenize": (("/tokenize",), "tokenize", "POST"),
          "detokenize": (("/detokenize",), "detokenize", "POST"),
          "root": (("/",), "console", "GET"),
          "console": (("/ui", "/ui/"), "console", "GET"),
          "asset": (("/ui/{name}",), "console", "GET"),
          "status": (("/api/status",), "status", "GET"),
          "events": (("/api/events",), "events", "GET")}


def build(server, handlers: dict[str, Callable], api_key: str | None, count,
          cors_origins: tuple[str, ...] = ("*",)) -> Starlette:
    """The app of `handlers` (one per ROUTES name, each called as handler(server, request)),
    each behind the key check and counted with `count(name, status)`; browsers from
    `cors_origins` may call it (CORS: a preflight OPTIONS is answered without the API key,
    answers carry Access-Control-Allow-Origin)."""
    def bound(handler) -> Handler:
        async def handle(request: Request) -> Response:
            return await handler(server, request)
        return handle

    routes = [Route(path, guarded(bound(handlers[key]), name, api_key, count),
                    methods=[method])
              for key, (paths, name, method) in ROUTES.items() for path in paths]
    cors = Middleware(CORSMiddleware, allow_origins=list(cors_origins), allow_methods=["*"],
                      allow_headers=["*"], max_age=600)
    return Starlette(routes=routes, middleware=[cors],
                     exception_handlers={HTTPException: _http_error})


def guarded(handler: Handler, name: str, api_key: str | None, count) -> Handler:
    """The handler behind the API key check, with ApiError as its error object, counted."""
    async def guarded(request: Request) -> Response:
        try:
            if api_key is not None and not public(request.url.path):
                check_key(request, api_key)
            response = await handler(request)
        except ApiError as err:
            response = JSONResponse(err.body(), status_code=err.status,
                                    headers=err.headers or None)
        except Exception as err:  # a bug: an error object all the same, the traceback logged
            log.error("%s: internal error: %r", request.url.path, err, exc_info=err)
            response = JSONResponse(ApiError(500, f"internal error: {err!r}").body(),
                                    status_code=500)
        count(name, response.status_code)
        return response
    return guarded


def public(path: str) -> bool:
    """Whether `path` is answered without the API key (/health, the console's page and
    files: none of them holds data; /api/status and /api/events do)."""
    return path in PUBLIC or path.startswith(PUBLIC_UNDER)


def check_key(request: Request, key: str) -> None:
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


async def read_body(request: Request) -> bytes:
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


class QueueChoices:
    """A request's choices, whose events come on `events` (the table puts them there), and
    its client; `on_cancel` ends its generations."""

    def __init__(self, request: Request, rid: int, events: asyncio.Queue,
                 on_cancel: Callable[[], object]):
        self.request, self.rid, self.events, self.on_cancel = request, rid, events, on_cancel
        self.seen = time.monotonic()   # the client last seen connected

    def cancel(self) -> None:
        self.on_cancel()

    async def next(self):
        """The next (choice, event); None once the client has gone (its generations are
        then cancelled). Whether it has is looked at every DISCONNECT_CHECK_S."""
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


def _pieces(event) -> list:
    """A Done carrying the answer's last text is that text's Piece, then the Done."""
    if isinstance(event, Done) and event.text:
        return [Piece(event.text, 0), event]
    return [event]


async def whole(choices: QueueChoices, reply: Reply) -> Response:
    try:
        while (got := await choices.next()) is not None:
            index, event = got
            for event in _pieces(event):
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


async def events(choices: QueueChoices, reply: Reply, opened: bool = False):
    """Server-sent events: the chunks (after the opening ones unless `opened`), each
    choice's finish chunk, the usage chunk if asked, then [DONE]; an error object if a
    generation failed. Leaving early (client gone) cancels the generations."""
    try:
        if not opened:
            for chunk in reply.opening():
                yield sse(chunk)
        while (got := await choices.next()) is not None:
            index, event = got
            for event in _pieces(event):
                for text in _event_chunks(reply, index, event):
                    yield text
                if isinstance(event, Failed) or reply.complete:
                    return
    finally:
        choices.cancel()


async def embedded(choices: QueueChoices, ask, model: str) -> Response:
    """The answer of an embedding request (embeddings.py) from its one event."""
    try:
        got = await choices.next()
        if got is None:
            return Response(status_code=499)  # nobody is there to read it
        event = got[1]
        if isinstance(event, Failed):
            raise ApiError(event.status, event.message)
        if not isinstance(event, Embedded):
            raise ApiError(500, f"an embedding request got {type(event).__name__}")
        return JSONResponse(embeddings.response(ask, model, event))
    finally:
        choices.cancel()


def _event_chunks(reply: Reply, index: int, event) -> list[str]:
    if isinstance(event, Failed):
        return [sse(ApiError(event.status, event.message).body())]
    if isinstance(event, Done):
        reply.end(index, event)
        chunks = [sse(c) for c in reply.finished(index)]
        if reply.complete:
            chunks += [sse(c) for c in reply.closing()] + ["data: [DONE]\n\n"]
        return chunks
    chunk = reply.chunk(index, event)
    return [] if chunk is None else [sse(chunk)]


def sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"
