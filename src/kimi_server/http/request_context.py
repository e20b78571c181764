"""per-request id, rate-limit headers, metrics and one log line.

Every response gets ``x-request-id`` (the client's own when it is sane, else a new one) and,
for a key with limits, the ``x-ratelimit-*`` headers the gateway left on the request state.
The log line is JSON with ids, route, status, timings and token counts: never a key or a prompt.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kimi_server.errors import InternalServerError
from kimi_server.gate.gateway import (
    STATE_CLIENT_ID,
    STATE_HEADERS,
    STATE_KEY,
    STATE_MODEL,
    STATE_REQUEST_ID,
    STATE_USAGE,
)
from kimi_server.gate.metrics import Metrics
from kimi_server.log_json import Fields
from kimi_server.logsafe import log_failure

log = logging.getLogger("kimi_server.requests")
_SANE_ID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")
# Known endpoints keep the metric labels few; anything else is "other".
_ENDPOINTS = {
    "/v1/chat/completions": "chat.completions",
    "/v1/responses": "responses",
    "/v1/models": "models",
    "/metrics": "metrics",
    "/health": "health",
}


def endpoint_label(path: str) -> str:
    if path in _ENDPOINTS:
        return _ENDPOINTS[path]
    if path.startswith("/v1/models/"):
        return "models"
    if path.startswith("/admin/"):
        return "admin"
    return "other"


class RequestContext:
    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        state: dict[str, Any] = scope.setdefault("state", {})
        server_id = "req_" + secrets.token_hex(12)
        sent = dict(scope.get("headers") or ()).get(b"x-request-id", b"").decode("latin-1")
        client_id = sent if _SANE_ID.fullmatch(sent) else None
        state[STATE_REQUEST_ID] = server_id
        state[STATE_CLIENT_ID] = client_id
        status = 500
        status_sent = False
        streaming = False

        async def send_with_headers(message: Message) -> None:
            nonlocal status, status_sent, streaming
            if message["type"] == "http.response.start":
                status, status_sent = message["status"], True
                headers = list(message.get("headers", []))
                headers.append((b"x-request-id", (client_id or server_id).encode()))
                for name, value in (state.get(STATE_HEADERS) or {}).items():
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
            body = json.dumps(InternalServerError().to_body()).encode()
            await send_with_headers({
                "type": "http.response.start", "status": 500,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            })
            await send_with_headers({"type": "http.response.body", "body": body})
        finally:
            if streaming:
                self.metrics.streams.dec()
            self._record(scope, state, status, time.monotonic() - started, server_id, client_id)

    def _record(
        self, scope: Scope, state: dict[str, Any], status: int, elapsed: float, server_id: str, client_id: str | None
    ) -> None:
        path = scope.get("path", "")
        endpoint = endpoint_label(path)
        model = state.get(STATE_MODEL) or ""
        self.metrics.requests.labels(model, endpoint, str(status)).inc()
        self.metrics.latency.labels(endpoint).observe(elapsed)
        if status in (401, 403):
            self.metrics.rejections.labels("auth").inc()
        if not log.isEnabledFor(logging.INFO):
            return
        line = Fields({
            "message": "request",
            "request_id": server_id,
            "client_request_id": client_id,
            "method": scope.get("method"),
            "path": path,
            "status": status,
            "duration_ms": round(elapsed * 1000, 3),
            "key_id": state.get(STATE_KEY),
            "model": model or None,
        })
        usage = state.get(STATE_USAGE)
        if usage:
            for field in ("prompt_tokens", "cached_tokens", "completion_tokens", "reasoning_tokens", "cost_nanos",
                          "ttft_ms"):
                line[field] = usage[field]
        log.info(line)  # encoded once, by the log's formatter (log_json.py)
