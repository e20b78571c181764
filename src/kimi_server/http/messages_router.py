"""``POST /v1/messages`` and ``/v1/messages/count_tokens``, Anthropic's door, also under
``/anthropic`` (``ANTHROPIC_BASE_URL=http://host:8000/anthropic``, as with Kimi's platform).
Errors on these paths take Anthropic's shape (``http/errors.py``)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from kimi_server.gate.admit import Caller
from kimi_server.gate.auth import Principal
from kimi_server.gate.request_record import request_record
from kimi_server.http.generating import ERRORS, Door, respond
from kimi_server.http.link import HttpLink
from kimi_server.http.routes import ANTHROPIC, COUNT_TOKENS, MESSAGES
from kimi_server.http.sse import PING, messages_failure, messages_sse
from kimi_server.http.state import app_pipeline, authenticated
from kimi_server.protocol.messages import CountTokensRequest, MessagesRequest
from kimi_server.serving.messages_front import COUNT_TOKENS as COUNTING
from kimi_server.serving.messages_front import MESSAGES as FRONT

router = APIRouter(tags=["Messages"])
DOOR = Door(
    FRONT, frames=lambda _, events: messages_sse(events), failure=lambda _, exc: messages_failure(exc), keep_alive=PING
)


async def create_message(
    body: MessagesRequest, request: Request, principal: Principal = Depends(authenticated)
) -> Response:
    """Creates a message (Anthropic's Messages API); SSE when ``stream`` is true."""
    return await respond(DOOR, body, request, principal, stream=bool(body.stream))


async def count_tokens(
    body: CountTokensRequest, request: Request, principal: Principal = Depends(authenticated)
) -> dict[str, int]:
    """The input tokens the request would bring, as it would be billed. Free of charge."""
    caller = Caller(principal, request_record(request.scope), HttpLink(request))
    return {"input_tokens": await app_pipeline(request).count_prompt(COUNTING, body, caller)}


for prefix in ("", ANTHROPIC):
    router.add_api_route(prefix + MESSAGES, create_message, methods=["POST"], responses=ERRORS)
    router.add_api_route(prefix + COUNT_TOKENS, count_tokens, methods=["POST"], responses=ERRORS)
