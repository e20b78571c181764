"""What the two generating routes (``chat_router.py``, ``responses_router.py``) share: the
errors they document, the engine a request names, and the shape of a streamed answer."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import StreamingResponse

from kimi_server.engines.base import Engine
from kimi_server.http.state import AppState
from kimi_server.protocol.common import ErrorBody

# What the server really returns (docs/contract.md, Errors); invalid input is a 400, never 422.
ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorBody} for code in (400, 401, 404, 413, 429, 500, 503)}
# No cache may hold a stream, and no proxy may buffer it (nginx reads X-Accel-Buffering).
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def named_engine(state: AppState, model: str) -> Engine | None:
    """The engine of the model id a request names, before the request is checked (whether it
    takes images decides a 400); None for an id this server does not serve (a 404 later)."""
    return state.engines.for_model(model) if model in state.engines.served() else None


def sse_response(frames: AsyncIterator[bytes]) -> StreamingResponse:
    return StreamingResponse(frames, media_type="text/event-stream", headers=SSE_HEADERS)
