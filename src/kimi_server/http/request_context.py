"""per-request id, rate-limit headers, metrics and one log line.

Every response gets ``x-request-id`` (the client's own when it is sane, else a new one) and,
for a key with limits, the ``x-ratelimit-*`` headers the gateway left on the request's record
(``gate/request_record.py:RequestRecord``, opened here for each request).
The log line is JSON with ids, route, status, timings and token counts: never a key or a prompt.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from datetime import UTC, datetime

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kimi_server.errors import EngineUnavailableError, InternalServerError
from kimi_server.gate.metrics import Metrics
from kimi_server.gate.request_record import RECORD, RequestRecord, new_request_id
from kimi_server.http.errors import send_error
from kimi_server.http.routes import endpoint_label, speaks_anthropic
from kimi_server.log_json import Fields
from kimi_server.logsafe import log_failure

log = logging.getLogger("kimi_server.requests")
_SANE_ID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")


def added_headers(record: RequestRecord, shown_id: bytes, status: int) -> list[tuple[bytes, bytes]]:
    """The request's id, and the key's limits where it has any (Retry-After on a 429 only)."""
    out = [(b"x-request-id", shown_id)]
    for name, value in (record.ratelimit_headers or {}).items():
        if name != "retry-after" or status == 429:
            out.append((name.encode(), value.encode()))
    return out


def anthropic_headers(record: RequestRecord, shown_id: bytes) -> list[tuple[bytes, bytes]]:
    """What Anthropic's door adds: the request's id under its own name (the SDKs read it), and
    the key's limits as ``anthropic-ratelimit-*``."""
    out = [(b"request-id", shown_id)]
    if record.ratelimit is not None:
        now = datetime.now(UTC)
        out += [(k.encode(), v.encode()) for k, v in record.ratelimit.anthropic_headers(now).items()]
    return out


SHUTTING_DOWN = EngineUnavailableError(
    "The server is shutting down; retry the request.", code="server_shutting_down", retry_after=1
)


class RequestContext:
    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        sent = dict(scope.get("headers") or ()).get(b"x-request-id", b"").decode("latin-1")
        record = RequestRecord(new_request_id(), sent if _SANE_ID.fullmatch(sent) else None)
        scope[RECORD] = record
        shown_id = (record.client_request_id or record.request_id).encode()
        anthropic = speaks_anthropic(scope.get("path", ""))
        status = 500
        status_sent = False
        streaming = False

        async def send_with_headers(message: Message) -> None:
            nonlocal status, status_sent, streaming
            if message["type"] == "http.response.start":
                status, status_sent = message["status"], True
                headers = [*message.get("headers", []), *added_headers(record, shown_id, status)]
                headers += anthropic_headers(record, shown_id) if anthropic else []
                message["headers"] = headers
                streaming = any(k.lower() == b"content-type" and v.startswith(b"text/event-stream") for k, v in headers)
                if streaming:
                    self.metrics.streams.inc()
            await send(message)

        try:
            await self.app(scope, receive, send_with_headers)
        except asyncio.CancelledError:
            # uvicorn cancels what still runs when its graceful shutdown runs out (a prompt still
            # being read): an answer not begun is a 503 to retry elsewhere, not a 500 with a
            # traceback; a stream already going just ends. The task ends here, as asked.
            if not status_sent:
                status = 503
                with contextlib.suppress(Exception):
                    await send_error(send_with_headers, SHUTTING_DOWN, path=scope.get("path", ""))
        except Exception as exc:
            # Unhandled errors are answered here rather than by Starlette's outermost
            # handler, so the 500 carries the request id too.
            if status_sent:
                raise
            log_failure(log, "unhandled error", exc)
            await send_error(send_with_headers, InternalServerError(), path=scope.get("path", ""))
        finally:
            if streaming:
                self.metrics.streams.dec()
            self._record(scope, record, status, time.monotonic() - started)

    def _record(self, scope: Scope, record: RequestRecord, status: int, elapsed: float) -> None:
        path = scope.get("path", "")
        endpoint = endpoint_label(path)
        model = record.model or ""
        metrics = self.metrics
        metrics.child(metrics.requests, model, endpoint, str(status)).inc()
        metrics.child(metrics.latency, endpoint).observe(elapsed)
        if status in (401, 403):
            metrics.child(metrics.rejections, "auth").inc()
        if not log.isEnabledFor(logging.INFO):
            return
        line = Fields(
            {
                "message": "request",
                "request_id": record.request_id,
                "client_request_id": record.client_request_id,
                "method": scope.get("method"),
                "path": path,
                "status": status,
                "duration_ms": round(elapsed * 1000, 3),
                "key_id": record.key_id,
                "model": model or None,
            }
        )
        usage = record.usage
        if usage:
            for field in (
                "prompt_tokens",
                "cached_tokens",
                "completion_tokens",
                "reasoning_tokens",
                "cost_nanos",
                "ttft_ms",
            ):
                line[field] = usage[field]
        log.info(line)  # encoded once, by the log's formatter (log_json.py)
