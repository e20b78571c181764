"""``POST /v1/responses``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from kimi_server.engines.base import AsyncStream
from kimi_server.gate.auth import Principal
from kimi_server.http.generating import ERRORS, Door, respond
from kimi_server.http.sse import event_frame
from kimi_server.http.state import authenticated
from kimi_server.protocol.responses import ResponsesRequest
from kimi_server.serving.pipeline import Run
from kimi_server.serving.responses import failed_events
from kimi_server.serving.responses_front import RESPONSES
from kimi_server.serving.responses_request import ResponsesPlan

router = APIRouter(tags=["Responses"])


async def responses_sse(events: AsyncStream[dict[str, Any]]) -> AsyncIterator[bytes]:
    """``event: <type>`` plus one ``data:`` line per event; failures arrive as response.failed."""
    async for event in events:
        yield event_frame(event["type"], event)


def failed(run: Run[ResponsesPlan], exc: BaseException) -> bytes:
    """A stream that failed before its first event: the response created, then failed."""
    events = failed_events(run.plan, run.services.sealer, exc)
    return b"".join(event_frame(event["type"], event) for event in events)


DOOR = Door(RESPONSES, frames=lambda _, events: responses_sse(events), failure=failed)


@router.post("/v1/responses", responses=ERRORS)
async def create_response(
    body: ResponsesRequest,
    request: Request,
    principal: Principal = Depends(authenticated),
) -> Response:
    """Creates a model response; SSE when ``stream`` is true. Stateless: nothing is stored."""
    return await respond(DOOR, body, request, principal, stream=bool(body.stream))
