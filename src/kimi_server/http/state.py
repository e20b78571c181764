"""What the routers need at request time, kept on ``app.state``: the services and the pipeline."""

from __future__ import annotations

from fastapi import Request

from kimi_server.errors import APIError, AuthenticationError
from kimi_server.gate.auth import Principal
from kimi_server.gate.request_record import request_record
from kimi_server.http.admin_key import bearer_token
from kimi_server.http.credentials import presented
from kimi_server.http.routes import ADMITTING
from kimi_server.serving.pipeline import Pipeline
from kimi_server.serving.services import Services


def app_state(request: Request) -> Services:
    state: Services = request.app.state.kimi
    return state


def app_pipeline(request: Request) -> Pipeline:
    pipeline: Pipeline = request.app.state.kimi_pipeline
    return pipeline


async def authenticated(request: Request) -> Principal:
    """Dependency for every route but health: the principal the guard found for the key
    (``http/guard.py``), with the caller's rate-limit headers where the gateway is on."""
    state = app_state(request)
    record = request_record(request.scope)
    if record.principal is None:
        # A path the guard lets through without a key, whose route asks for one itself
        # (``/openapi.json`` unless public, ``/health?deep=1``); throttled as the guard does.
        authorization = presented(dict(request.scope["headers"]))
        found: list[Principal] = []

        async def check() -> APIError | None:
            try:
                found.append(await authenticate(state, authorization))
            except AuthenticationError as exc:
                return exc
            return None

        refusal = await state.throttle.screen(request.scope, bearer_token(authorization), "api", check)
        if refusal is not None:
            raise refusal
        record.principal = found[0]
    if state.gateway is not None:
        admitting = request.scope["path"] in ADMITTING
        await state.gateway.note_caller(record.principal, record, admitting=admitting)
    return record.principal


async def authenticate(state: Services, authorization: str | None) -> Principal:
    """An ``Authorization`` header's principal: static keys first (no I/O), then the
    gateway's stored keys; AuthenticationError (401) otherwise."""
    if state.gateway is not None:
        return await state.gateway.principal(state.keys, authorization)
    return state.keys.authenticate(authorization)
