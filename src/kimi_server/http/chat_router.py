"""``POST /v1/chat/completions``."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from kimi_server.gate.auth import Principal
from kimi_server.http.generating import ERRORS, Door, respond
from kimi_server.http.sse import DONE, chat_event_sse, data_frame, failure_body
from kimi_server.http.state import authenticated
from kimi_server.protocol.chat import ChatCompletionRequest
from kimi_server.serving.chat_front import CHAT

router = APIRouter(tags=["Chat Completions"])

DOOR = Door(
    CHAT,
    frames=lambda run, events: chat_event_sse(events, run.plan.gen.model, include_usage=run.plan.include_usage),
    failure=lambda _, exc: data_frame(failure_body(exc)) + DONE,
)


@router.post("/v1/chat/completions", responses=ERRORS)
async def create_chat_completion(
    body: ChatCompletionRequest,
    request: Request,
    principal: Principal = Depends(authenticated),
) -> Response:
    """Creates a model response for the conversation; SSE when ``stream`` is true."""
    return await respond(DOOR, body, request, principal, stream=bool(body.stream))
