"""``POST /v1/responses``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse

from kimi_server.gate.auth import Principal
from kimi_server.http.sse import event_frame, prime
from kimi_server.http.state import app_state, authenticated
from kimi_server.protocol.common import ErrorBody
from kimi_server.protocol.responses import ResponsesRequest
from kimi_server.serving import responses
from kimi_server.serving.responses_request import build_responses_request

router = APIRouter(tags=["Responses"])

# What the server really returns (docs/contract.md, Errors); invalid input is a 400, never 422.
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (400, 401, 404, 413, 500, 503)
}


async def responses_sse(events: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    """``event: <type>`` plus one ``data:`` line per event; failures arrive as response.failed."""
    async for event in events:
        yield event_frame(event["type"], event)


@router.post("/v1/responses", responses=ERRORS)
async def create_response(
    body: ResponsesRequest,
    request: Request,
    principal: Principal = Depends(authenticated),
) -> Any:
    """Creates a model response; SSE when ``stream`` is true. Stateless: nothing is stored."""
    state = app_state(request)
    served = state.engines.served()
    engine = state.engines.for_model(body.model) if body.model in served else None
    plan = build_responses_request(
        body,
        served=served,
        budgets=state.settings.budgets,
        key_id=principal.key_id,
        accepts_images=engine.accepts_images() if engine else False,
        sealer=state.sealer,
    )
    engine = state.engines.for_model(plan.gen.model)
    # The first engine event is pulled before anything is sent, so early failures are HTTP errors.
    events = await prime(engine.generate(plan.gen))
    if not body.stream:
        return JSONResponse(await responses.complete(plan, state.sealer, events))
    return StreamingResponse(
        responses_sse(responses.stream(plan, state.sealer, events)),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
