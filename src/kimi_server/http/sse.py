"""Server-sent events framing. Each event is encoded whole and handed over as one write."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any, TypeVar

from kimi_server.errors import APIError, InternalServerError
from kimi_server.logsafe import log_failure

log = logging.getLogger(__name__)
T = TypeVar("T")

DONE = b"data: [DONE]\n\n"


def _dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def data_frame(obj: Any) -> bytes:
    return f"data: {_dumps(obj)}\n\n".encode()


def event_frame(event_type: str, obj: Any) -> bytes:
    return f"event: {event_type}\ndata: {_dumps(obj)}\n\n".encode()


async def prime(events: AsyncIterator[T]) -> AsyncIterator[T]:
    """Pulls the first item now, so failures before any output become plain HTTP errors."""
    first = await anext(events)

    async def rest() -> AsyncIterator[T]:
        async with aclosing(events):  # type: ignore[type-var]
            yield first
            async for item in events:
                yield item

    return rest()


def failure_body(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, APIError):
        return exc.to_body()
    log_failure(log, "stream failed", exc)
    return InternalServerError().to_body()


async def chat_sse(chunks: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    """Chat Completions framing: ``data:`` lines, an error event on failure, always ``[DONE]``."""
    async with aclosing(chunks):  # type: ignore[type-var]
        try:
            async for chunk in chunks:
                yield data_frame(chunk)
        except Exception as exc:
            yield data_frame(failure_body(exc))
    yield DONE
