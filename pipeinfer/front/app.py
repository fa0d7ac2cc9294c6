"""The front's HTTP API: the same routes and answers as the job's own server (serve/app.py,
through front/http.py), with each request's state kept here so that it survives the
job. A completion is parsed by the job (which has the tokenizer and the grammars); its answer
is built here from the job's events, whichever job sends them."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from ..api import requests as api
from . import http as http_common
from ..api.requests import ApiError
from .http import QueueChoices, read_body
from ..api.responses import Reply
from .metrics import FrontMetrics
from .supervisor import Supervisor
from .table import Table

SEED_BITS = 32


@dataclass
class Front:
    supervisor: Supervisor
    table: Table
    metrics: FrontMetrics
    model_name: str
    api_key: str | None = None
    created: int = field(default_factory=lambda: int(time.time()))

    def unavailable(self) -> ApiError | None:
        """The 503 (with Retry-After while recovering) while no job takes requests."""
        state, reason = self.supervisor.state, self.supervisor.reason
        if state == "failed":
            return ApiError(503, f"the server has failed: {reason}")
        if state == "stopping":
            return ApiError(503, "the server is shutting down")
        if state != "ok":
            return ApiError(503, f"the server is {state}: {reason or 'loading the model'}",
                            headers={"Retry-After": "5"})
        return None

    def check_up(self) -> None:
        """Raise unavailable() if any (a completion arriving during a recovery waits in the
        table instead: see _complete)."""
        if (error := self.unavailable()) is not None:
            raise error


def build_app(front: Front, cors_origins: tuple[str, ...] = ("*",)):
    handlers = {"completions": _completions, "chat": _chat, "embeddings": _embeddings,
                "models": _models,
                "one_model": _one_model, "health": _health, "metrics": _metrics,
                "tokenize": _tokenize, "detokenize": _detokenize}
    return http_common.build(front, handlers, front.api_key,
                             http_common.metric_counter(front.metrics), cors_origins)


async def _completions(front: Front, request: Request) -> Response:
    return await _complete(front, request, "completions")


async def _chat(front: Front, request: Request) -> Response:
    return await _complete(front, request, "chat")


async def _complete(front: Front, request: Request, kind: str) -> Response:
    body = api.parse_body(await read_body(request))
    if front.supervisor.state in ("failed", "stopping", "waiting"):
        front.check_up()   # (a recovery's requests wait in the table instead)
    if body.get("seed") is None:   # sampled answers resume exactly only with a seed
        body["seed"] = secrets.randbits(SEED_BITS)
    pending = front.table.add(kind, body, front.supervisor.send, front.supervisor.up)
    choices = QueueChoices(request, lambda: front.table.cancel(pending.rid,
                                                               front.supervisor.send))
    try:
        ask = await pending.accepted   # refused: ApiError (400, 404, ...)
    except BaseException:
        front.table.requests.pop(pending.rid, None)
        raise
    choices.events = pending.events   # (filled by whichever job sends them)
    reply = Reply(ask, front.model_name, pending.rid)
    if ask.stream:
        return StreamingResponse(http_common.events(choices, reply),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    return await http_common.whole(choices, reply)


async def _embeddings(front: Front, request: Request) -> Response:
    """Taken as a completion is, by the job that is up; sent again to the next job if that
    one ends first."""
    body = api.parse_body(await read_body(request))
    if front.supervisor.state in ("failed", "stopping", "waiting"):
        front.check_up()   # (a recovery's requests wait in the table instead)
    pending = front.table.add("embeddings", body, front.supervisor.send, front.supervisor.up)
    choices = QueueChoices(request, lambda: front.table.cancel(pending.rid,
                                                               front.supervisor.send))
    try:
        ask = await pending.accepted
    except BaseException:
        front.table.requests.pop(pending.rid, None)
        raise
    choices.events = pending.events
    return await http_common.embedded(choices, ask, front.model_name)


async def _models(front: Front, request: Request) -> Response:
    return JSONResponse({"object": "list", "data": [_model(front)]})


async def _one_model(front: Front, request: Request) -> Response:
    api.check_model(request.path_params["model"], front.model_name)
    return JSONResponse(_model(front))


def _model(front: Front) -> dict:
    n_ctx = (front.supervisor.job.info.get("n_ctx") if front.supervisor.job else None)
    return {"id": front.model_name, "object": "model", "created": front.created,
            "owned_by": "pipeinfer", "meta": {"n_ctx": n_ctx}}


async def _health(front: Front, request: Request) -> Response:
    state, job = front.supervisor.state, front.supervisor.job
    if state == "ok":   # (and which job, its ranks: for operators and tests)
        ranks = [{"rank": r, "host": h, "pid": p} for r, h, p in job.info.get("statuses", [])]
        return JSONResponse({"status": "ok", "job": job.number, "ranks": ranks})
    error = front.unavailable()
    return JSONResponse(dict(error.body(), status=state), status_code=503,
                        headers=error.headers or None)


async def _metrics(front: Front, request: Request) -> Response:
    own = front.metrics.render()
    job = b""
    if front.supervisor.up >= 0:
        try:
            job = await front.table.call("metrics", {}, front.supervisor.send)
        except ApiError:
            job = b""
    return Response(own + job, media_type="text/plain; version=0.0.4; charset=utf-8")


async def _tokenize(front: Front, request: Request) -> Response:
    return await _call(front, request, "tokenize")


async def _detokenize(front: Front, request: Request) -> Response:
    return await _call(front, request, "detokenize")


async def _call(front: Front, request: Request, name: str) -> Response:
    body = api.parse_body(await read_body(request))
    front.check_up()
    return JSONResponse(await front.table.call(name, body, front.supervisor.send))
