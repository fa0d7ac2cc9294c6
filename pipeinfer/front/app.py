"""The HTTP handlers of `pipeinfer serve`, the only ones: OpenAI-style completions and chat
completions (streamed as server-sent events or whole), embeddings, models, tokenize /
detokenize, health and metrics; the web console's page (/ui, and / for a browser: page.py)
and its data (/api/status, /api/events: console.py). Routes, the API key and CORS are
http.py's.

Each request's state is kept here (table.py), so that it survives the job: a completion is
parsed by the job (which has the tokenizer and the grammars), and its answer is built here
from the job's events, whichever job sends them. The job is reached through its keeper: the
supervisor of a job the front launched, or the job this process is rank 0 of (in_job.py);
both have a `state` (loading, ok, recovering, waiting, failed, stopping) and its `reason`,
the job's `info` once it is ready, and `send` to it."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import (HTMLResponse, JSONResponse, RedirectResponse, Response,
                                 StreamingResponse)

from ..api import requests as api
from ..api.embeddings import parse as parse_embeddings
from ..api.errors import ApiError
from ..api.responses import Reply
from . import http, page
from .console import Console
from .metrics import ServiceMetrics
from .table import Table

SEED_BITS = 32
KEPT_WAITING = ("loading", "recovering")   # states in which a request waits in the table


@dataclass
class Front:
    jobs: Any          # the job's keeper (supervisor.Supervisor or in_job.InJob)
    table: Table
    metrics: ServiceMetrics
    model_name: str
    api_key: str | None = None
    console: Console | None = None
    created: int = field(default_factory=lambda: int(time.time()))

    def unavailable(self) -> ApiError | None:
        """The 503 (with Retry-After while loading or recovering) while no job takes
        requests."""
        state, reason = self.jobs.state, self.jobs.reason
        if state == "failed":
            return ApiError(503, f"the server has failed: {reason}")
        if state == "stopping":
            return ApiError(503, "the server is shutting down")
        if state != "ok":
            return ApiError(503, f"the server is {state}: {reason or 'loading the model'}",
                            headers={"Retry-After": "5"})
        return None

    def check_up(self) -> None:
        if (error := self.unavailable()) is not None:
            raise error


def build_app(front: Front, cors_origins: tuple[str, ...] = ("*",)):
    handlers = {"completions": _completions, "chat": _chat, "embeddings": _embeddings,
                "models": _models, "one_model": _one_model, "health": _health,
                "metrics": _metrics, "tokenize": _tokenize, "detokenize": _detokenize,
                "root": _root, "console": _console, "asset": _asset, "status": _status,
                "events": _events}
    return http.build(front, handlers, front.api_key, front.metrics.count, cors_origins)


async def _completions(front: Front, request: Request) -> Response:
    return await _complete(front, request, "completions")


async def _chat(front: Front, request: Request) -> Response:
    return await _complete(front, request, "chat")


async def _complete(front: Front, request: Request, kind: str) -> Response:
    body = api.parse_body(await http.read_body(request))
    if front.jobs.state not in KEPT_WAITING:
        front.check_up()
    if body.get("seed") is None:   # sampled answers resume exactly only with a seed
        body["seed"] = secrets.randbits(SEED_BITS)
    choices, ask = await _taken(front, request, kind, body)
    reply = Reply(ask, front.model_name, choices.rid)
    if ask.stream:
        return StreamingResponse(http.events(choices, reply), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    return await http.whole(choices, reply)


async def _embeddings(front: Front, request: Request) -> Response:
    """Taken as a completion is, by the job that is up; sent again to the next job if that
    one ends first."""
    body = api.parse_body(await http.read_body(request))
    parse_embeddings(body)   # (a bad one is refused here, before it waits for a job)
    if front.jobs.state not in KEPT_WAITING:
        front.check_up()
    choices, ask = await _taken(front, request, "embeddings", body)
    return await http.embedded(choices, ask, front.model_name)


async def _taken(front: Front, request: Request, kind: str, body: dict):
    """The request in the table and sent to the job: its choices' events and the job's
    checked Ask, once the job accepted it (refused: ApiError, 400, 404, ...)."""
    pending = front.table.add(kind, body, front.jobs.send, front.jobs.up)
    try:
        ask = await pending.accepted
    except BaseException:
        front.table.requests.pop(pending.rid, None)
        raise
    return http.QueueChoices(request, pending.rid, pending.events, lambda: front.table.cancel(
        pending.rid, front.jobs.send)), ask


async def _models(front: Front, request: Request) -> Response:
    return JSONResponse({"object": "list", "data": [_model(front)]})


async def _one_model(front: Front, request: Request) -> Response:
    api.check_model(request.path_params["model"], front.model_name)
    return JSONResponse(_model(front))


def _model(front: Front) -> dict:
    return {"id": front.model_name, "object": "model", "created": front.created,
            "owned_by": "pipeinfer", "meta": {"n_ctx": front.jobs.info.get("n_ctx")}}


async def _health(front: Front, request: Request) -> Response:
    jobs = front.jobs
    if jobs.state == "ok":   # (and which job, its ranks: for operators and tests)
        ranks = [{"rank": r, "host": h, "pid": p} for r, h, p in jobs.info.get("statuses", [])]
        return JSONResponse({"status": "ok", "job": jobs.number, "ranks": ranks})
    error = front.unavailable()
    return JSONResponse(dict(error.body(), status=jobs.state), status_code=503,
                        headers=error.headers or None)


async def _metrics(front: Front, request: Request) -> Response:
    job = None
    if front.jobs.up >= 0:   # (the job's totals now: the head answers at once)
        try:
            job = (front.jobs.number,
                   await front.table.call("metrics", {}, front.jobs.send))
        except ApiError:
            job = None
    return Response(front.metrics.render(job), media_type=front.metrics.content_type)


async def _tokenize(front: Front, request: Request) -> Response:
    return await _call(front, request, "tokenize")


async def _detokenize(front: Front, request: Request) -> Response:
    return await _call(front, request, "detokenize")


async def _call(front: Front, request: Request, name: str) -> Response:
    body = api.parse_body(await http.read_body(request))
    front.check_up()
    return JSONResponse(await front.table.call(name, body, front.jobs.send))


# --- the console ---------------------------------------------------------------------------
NO_STORE = {"Cache-Control": "no-store"}


async def _root(front: Front, request: Request) -> Response:
    """A browser at / goes to the console; anything else is told where it is."""
    if "text/html" in request.headers.get("accept", ""):
        return RedirectResponse("/ui", status_code=307)
    raise ApiError(404, "no such endpoint: / (the web console is at /ui)")


async def _console(front: Front, request: Request) -> Response:
    """The page: with the cluster as text, unless the key must be given first."""
    cluster = front.console.cluster() if front.api_key is None else None
    return HTMLResponse(page.page(cluster, front.model_name), headers=NO_STORE)


async def _asset(front: Front, request: Request) -> Response:
    name = request.path_params["name"]
    body = page.asset(name) if name in page.ASSETS else None
    if body is None:
        raise ApiError(404, f"no such file of the console: {name}")
    return Response(body, media_type=page.ASSETS[name], headers={"Cache-Control": "no-cache"})


async def _status(front: Front, request: Request) -> Response:
    return JSONResponse(front.console.status(), headers=NO_STORE)


async def _events(front: Front, request: Request) -> Response:
    return StreamingResponse(front.console.events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
