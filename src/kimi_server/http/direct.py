"""The two generating routes, dispatched without FastAPI's per-request machinery.

``POST /v1/chat/completions`` and ``POST /v1/responses`` are declared to FastAPI as usual
(``chat_router.py``, ``responses_router.py``): that is where their OpenAPI schema comes from.
FastAPI's dispatch of one request (routing, its exception and exit-stack layers, dependency
solving, the body read twice over) cost more CPU than the relay's whole upstream exchange, so
this last middleware serves those two paths itself, with the same steps in the same order: the
JSON body parsed as FastAPI parses it (``application/json`` or ``+json`` only), the caller
(``http/state.py:authenticated``), the body validated into the route's model (a failure is the
same 400 naming the field, ``http/errors.py:validation_error``), then the endpoint function
itself. An endpoint here takes exactly ``(body, request, principal)``: one that grows another
parameter must be given it here too (``tests/test_direct_routes.py`` compares both dispatches).
"""

from __future__ import annotations

import email.message
import json
from collections.abc import Awaitable, Callable
from functools import lru_cache
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from kimi_server.errors import APIError
from kimi_server.gate.auth import Principal
from kimi_server.http.errors import error_response, http_error_response, validation_error
from kimi_server.http.guard import PARSED_BODY, read_body
from kimi_server.http.json_checks import NOT_PARSED
from kimi_server.http.state import authenticated

Endpoint = Callable[[Any, Request, Principal], Awaitable[Response]]
Route = tuple[type[BaseModel], Endpoint]


class DirectRoutes:
    def __init__(self, app: ASGIApp, routes: dict[str, Route]) -> None:
        self.app = app
        self.routes = routes  # path → (body model, endpoint), for POST

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = self.routes.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if route is None:
            await self.app(scope, receive, send)
            return
        model, endpoint = route
        request = Request(scope, receive)
        raw = await read_body(receive) or b""  # the body the guard read and replays; b"": the client left
        try:
            data = _json_body(raw, _content_type(scope), scope)
            response = await _serve(model, endpoint, request, data)
        except APIError as exc:
            response = error_response(exc, scope["path"])
        except HTTPException as exc:
            response = http_error_response(exc, scope["path"])
        await response(scope, receive, send)


async def _serve(model: type[BaseModel], endpoint: Endpoint, request: Request, data: Any) -> Any:
    principal = await authenticated(request)
    try:
        body = model.model_validate(data)
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
        raise validation_error(RequestValidationError(errors, body=data)) from None
    return await endpoint(body, request, principal)


def _json_body(raw: bytes, ctype: bytes | None, scope: Scope) -> Any:
    """The body as FastAPI hands it to validation: parsed JSON for a JSON content type (as the
    guard parsed it, where it did), the raw bytes otherwise (which then fail validation as not
    an object)."""
    if not raw:
        raise validation_error(RequestValidationError([{"type": "missing", "loc": ("body",), "msg": "Field required"}]))
    if ctype is None or not _is_json(ctype):
        return raw
    parsed = scope.get(PARSED_BODY, NOT_PARSED)
    if parsed is not NOT_PARSED:
        return parsed
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        raise validation_error(RequestValidationError([{"type": "json_invalid", "loc": ("body",)}])) from None
    except ValueError:  # bytes that are not UTF-8
        raise HTTPException(400, "There was an error parsing the body") from None


@lru_cache(maxsize=64)
def _is_json(ctype: bytes) -> bool:
    message = email.message.Message()
    message["content-type"] = ctype.decode("latin-1")
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (subtype == "json" or subtype.endswith("+json"))


def _content_type(scope: Scope) -> bytes | None:
    for name, value in scope["headers"]:
        if name == b"content-type":
            return bytes(value)
    return None
