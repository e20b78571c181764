"""The playground: a page that builds a Chat Completions or Responses request, and one route
that sends it through the API as the signed-in key (``dispatch.py``) and streams the answer
back as the API wrote it; ``static/playground.js`` draws reasoning, answer, tool calls and
web-search sources apart, and shows the request as curl."""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Depends, Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from kimi_server.console.dispatch import forward
from kimi_server.console.session import Viewer, csrf_ok, viewer
from kimi_server.console.web import page
from kimi_server.errors import InvalidRequestError, PermissionDeniedError
from kimi_server.http.state import app_state
from kimi_server.policy.catalogue import find_model

router = APIRouter(prefix="/console/playground", include_in_schema=False)
PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses"}
MAX_BODY = 4 * 1024 * 1024


def _models(request: Request, who: Viewer) -> dict[str, list[str]]:
    """The models this key may call, each with the efforts it takes."""
    record = who.principal.record if who.principal else None
    out: dict[str, list[str]] = {}
    for model_id in sorted(app_state(request).engines.by_model):
        if record is not None and not record.allows(model_id):  # its own models, and its team's
            continue
        spec = find_model(model_id)
        out[model_id] = list(spec.efforts) if spec else []
    return out


@router.get("")
async def playground(request: Request, who: Viewer = Depends(viewer)) -> Response:
    state = app_state(request)
    models = _models(request, who)
    return page(
        request,
        "playground.html",
        who,
        models=models,
        models_json=json.dumps(models).replace("<", "\\u003c"),
        search=state.searcher is not None,
        origin=str(request.base_url).rstrip("/"),
    )


def refusal(error: InvalidRequestError | PermissionDeniedError) -> JSONResponse:
    return JSONResponse(error.to_body(), status_code=error.status_code)


def sending_key(who: Viewer, given: object) -> str:
    """The API key the playground sends with: the signed-in one, or (for the admin, whose own
    key is not an API key) the one pasted in the page."""
    if not who.admin:
        return who.key
    if not isinstance(given, str) or not given:
        raise InvalidRequestError("The admin key is not an API key: paste one to send with.", param="key")
    return given


@router.post("/send")
async def send(request: Request, who: Viewer = Depends(viewer)) -> Response:
    """``{"endpoint": "chat" | "responses", "body": {...}, "key": "..."}`` (``key`` only for the
    admin, whose own key is not an API key); the header ``X-CSRF-Token`` carries the session's
    token."""
    if not csrf_ok(who, request.headers.get("x-csrf-token")):
        return refusal(PermissionDeniedError("The page expired: reload it."))
    raw = await request.body()
    if len(raw) > MAX_BODY:
        return refusal(InvalidRequestError("The request is too large for the playground.", param="body"))
    try:
        sent: Any = json.loads(raw)
    except ValueError:
        return refusal(InvalidRequestError("The playground sends JSON.", param="body"))
    if not isinstance(sent, dict) or sent.get("endpoint") not in PATHS or not isinstance(sent.get("body"), dict):
        return refusal(
            InvalidRequestError("'endpoint' must be chat or responses, with a 'body' object.", param="endpoint")
        )
    try:
        key = sending_key(who, sent.get("key"))
    except InvalidRequestError as error:
        return refusal(error)
    body = json.dumps(sent["body"]).encode()
    answer = await forward(request.app, request.scope, PATHS[sent["endpoint"]], key, body)
    return StreamingResponse(
        answer.body,
        status_code=answer.status,
        media_type=answer.content_type,
        headers={"cache-control": "no-store", "x-accel-buffering": "no"},
    )
