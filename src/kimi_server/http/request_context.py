"""per-request id, rate-limit headers, metrics and one log line.

Every response gets ``x-request-id`` (the client's own when it is sane, else a new one) and,
for a key with limits, the ``x-ratelimit-*`` headers the gateway left on the request's record
(``gate/ticket.py:RequestRecord``, opened here for each request).
The log line is JSON with ids, route, status, timings and token counts: never a key or a prompt.
"""

from __future__ import annotations

import logging
import re
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kimi_server.errors import InternalServerError
from kimi_server.gate.metrics import Metrics
from kimi_server.gate.ticket import RECORD, RequestRecord, new_request_id
from kimi_server.http.errors import send_error
from kimi_server.http.routes import endpoint_label
from kimi_server.log_json import Fields
from kimi_server.logsafe import log_failure

log = logging.getLogger("kimi_server.requests")
_SANE_ID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")


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
        status = 500
        status_sent = False
        streaming = False

        async def send_with_headers(message: Message) -> None:
            nonlocal status, status_sent, streaming
            if message["type"] == "http.response.start":
                status, status_sent = message["status"], True
                headers = list(message.get("headers", []))
                headers.append((b"x-request-id", shown_id))
                for name, value in (record.ratelimit_headers or {}).items():
                    if name == "retry-after" and status != 429:
                        continue
                    headers.append((name.encode(), value.encode()))
                message["headers"] = headers
                streaming = any(k.lower() == b"content-type" and v.startswith(b"text/event-stream") for k, v in headers)
                if streaming:
                    self.metrics.streams.inc()
            await send(message)

        try:
            await self.app(scope, receive, send_with_headers)
        except Exception as exc:
            # Unhandled errors are answered here rather than by Starlette's outermost
            # handler, so the 500 carries the request id too.
            if status_sent:
                raise
            log_failure(log, "unhandled error", exc)
            await send_error(send_with_headers, InternalServerError())
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
