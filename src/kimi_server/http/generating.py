"""What every generating door shares: the one call into the pipeline, and the answer sent back
as JSON or as server-sent events.

A door is its front (``serving/``: the wire format turned into a plan, the engine's events into
its output) and its framing (the front's stream items as SSE bytes). ``respond`` makes the call:
the request admitted, then the whole answer, or the stream once its first item is ready (so a
request refused before any output is a plain HTTP error) or, when that takes longer than
``stream_first_event_grace``, at once, keeping the client company until the first item comes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.responses import Response

from kimi_server.engines.base import AsyncStream
from kimi_server.gate.admit import Caller
from kimi_server.gate.auth import Principal
from kimi_server.gate.request_record import request_record
from kimi_server.http.event_stream import COMMENT, EventStream
from kimi_server.http.link import HttpLink
from kimi_server.http.state import app_pipeline, app_state
from kimi_server.protocol.common import ErrorBody
from kimi_server.serving.pipeline import Front, Plan, Run
from kimi_server.serving.primed import first_within

# What the server really returns (docs/contract.md, Errors); invalid input is a 400, never 422.
ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorBody} for code in (400, 401, 404, 413, 429, 500, 503)}

BodyT = TypeVar("BodyT")
PlanT = TypeVar("PlanT", bound=Plan)


@dataclass(frozen=True)
class Door(Generic[BodyT, PlanT]):
    front: Front[BodyT, PlanT]
    frames: Callable[[Run[PlanT], AsyncStream[Any]], AsyncIterator[bytes]]  # stream items → SSE
    failure: Callable[[Run[PlanT], BaseException], bytes]  # a failure the frames let escape
    keep_alive: bytes = COMMENT  # sent while nothing else is


async def respond(
    door: Door[BodyT, PlanT], body: BodyT, request: Request, principal: Principal, *, stream: bool
) -> Response:
    link = HttpLink(request)
    caller = Caller(principal, request_record(request.scope), link)
    run = await app_pipeline(request).start(door.front, body, caller)
    if not stream:
        try:
            return JSONResponse(await link.until_gone(door.front.complete(run)))
        finally:
            run.release()
    settings = app_state(request).settings
    try:
        items = await link.until_gone(first_within(door.front.stream(run), settings.stream_first_event_grace))
    except BaseException:
        run.release()
        raise
    return EventStream(
        door.frames(run, items),
        link=link,
        failure=lambda exc: door.failure(run, exc),
        on_end=run.release,
        keep_alive=door.keep_alive,
        interval=settings.stream_keep_alive,
    )
