"""Renders every failure in the API's error shape: ``{"error": {"message", "type", "code"}}``."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Send

from kimi_server.errors import APIError, InternalServerError, InvalidRequestError
from kimi_server.http.routes import speaks_anthropic
from kimi_server.logsafe import log_failure
from kimi_server.serving.messages_errors import anthropic_error

log = logging.getLogger(__name__)


def rendered(error: APIError, path: str) -> tuple[int, dict[str, object]]:
    """The status and body of ``error`` in the shape of the door ``path`` is on."""
    if speaks_anthropic(path):
        return anthropic_error(error)
    return error.status_code, error.to_body()


def error_response(error: APIError, path: str = "") -> JSONResponse:
    status, body = rendered(error, path)
    return JSONResponse(body, status_code=status, headers=error_headers(error))


async def send_error(send: Send, error: APIError, *, close: bool = False, path: str = "") -> None:
    """The same answer as ``error_response``, written by pure ASGI middleware (which answers
    before any route runs). ``close``: the connection ends with it (a body left unread)."""
    status, shaped = rendered(error, path)
    body = json.dumps(shaped).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in error_headers(error).items()]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


# headers that go with an error: when to retry, and how to authenticate.
def error_headers(error: APIError) -> dict[str, str]:
    headers: dict[str, str] = {}
    if error.retry_after is not None:
        headers["Retry-After"] = str(error.retry_after)
    if error.status_code == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="kimi-server"'
    return headers


def _path(loc: tuple[Any, ...], body: Any) -> str:
    """A pydantic error location as the client wrote it: ``messages[0].content``.

    Union members and discriminator tags show up in ``loc`` as extra segments; they are
    dropped by walking the location along the actual request body.
    """
    parts: list[str] = []
    node = body
    tag_skipped = False
    segs = list(loc[1:] if loc and loc[0] == "body" else loc)
    for n, seg in enumerate(segs):
        if (
            isinstance(node, dict)
            and seg == node.get("type")
            and not tag_skipped
            and n + 1 < len(segs)
            and segs[n + 1] == seg
        ):
            # A tag that is also a field name (``{"type": "function", "function": ...}``):
            # the first of the two is the tag.
            tag_skipped = True
            continue
        if isinstance(seg, int):
            parts.append(f"[{seg}]")
            node = node[seg] if isinstance(node, list) and seg < len(node) else None
            tag_skipped = False
            continue
        if isinstance(node, dict) and seg not in node:
            if "[" in seg or (seg == node.get("type") and not tag_skipped):
                tag_skipped = True
                continue  # a union member's name or discriminator tag, not a field
        elif not isinstance(node, dict) and node is not None:
            continue  # a union member's name inside a scalar or list value
        parts.append(f".{seg}" if parts else str(seg))
        node = node.get(seg) if isinstance(node, dict) else None
        tag_skipped = False
    return "".join(parts)


def validation_error(exc: RequestValidationError) -> InvalidRequestError:
    errors = list(exc.errors())
    body = getattr(exc, "body", None)
    if isinstance(body, Mapping) and not isinstance(body, dict):
        body = dict(body)  # a multipart form: its fields are named as a JSON body's are
    # With unions pydantic reports one error per member; the deepest one is the specific one.
    first = max(errors, key=lambda e: len(e.get("loc", ()))) if errors else {"type": "", "loc": ()}
    kind = str(first.get("type", ""))
    loc = tuple(first.get("loc", ()))
    if kind == "json_invalid":
        return InvalidRequestError(
            "We could not parse the JSON body of your request: it is not valid JSON.",
            code="invalid_json",
        )
    param = _path(loc, body)
    if not param:
        if kind == "missing":
            return InvalidRequestError("The request body is empty; send a JSON object.")
        return InvalidRequestError("The request body must be a JSON object.")
    if kind == "missing":
        return InvalidRequestError(f"Missing required parameter: '{param}'.", param=param)
    msg = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    return InvalidRequestError(f"Invalid value for '{param}': {msg}.", param=param, code="invalid_value")


def http_error_response(exc: StarletteHTTPException, path: str = "") -> JSONResponse:
    """Starlette's own HTTP errors (unknown path, wrong method, an unparsable body)."""
    names = {404: ("not_found_error", "not_found"), 405: ("invalid_request_error", "method_not_allowed")}
    etype, code = names.get(exc.status_code, ("invalid_request_error", "http_error"))
    message = "Not found." if exc.status_code == 404 else str(exc.detail)
    body: dict[str, Any] = {"error": {"message": message, "type": etype, "code": code}}
    if speaks_anthropic(path):
        body = {"type": "error", "error": {"type": etype, "message": message}}
    return JSONResponse(body, status_code=exc.status_code, headers=getattr(exc, "headers", None))


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return error_response(exc, request.url.path)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(validation_error(exc), request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return http_error_response(exc, request.url.path)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log_failure(log, "unhandled error", exc)  # no client text in the log
        return error_response(InternalServerError(), request.url.path)
