"""What the routers need at request time, kept on ``app.state``."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from kimi_server.gate.auth import KeyRing, Principal
from kimi_server.gate.gateway import Gateway
from kimi_server.gate.ticket import request_record
from kimi_server.http.routes import ADMITTING
from kimi_server.media.intake import MediaIntake
from kimi_server.search.searcher import Searcher
from kimi_server.serving.common import EngineSet
from kimi_server.serving.sealing import Sealer
from kimi_server.settings import Settings


@dataclass
class AppState:
    settings: Settings
    engines: EngineSet
    keys: KeyRing
    sealer: Sealer
    gateway: Gateway | None = None  # None when turned off
    searcher: Searcher | None = None  # None when no provider
    media: MediaIntake | None = None


def app_state(request: Request) -> AppState:
    state: AppState = request.app.state.kimi
    return state


async def authenticated(request: Request) -> Principal:
    """Dependency for every route but health: the principal the guard found for the key
    (``http/guard.py``), with the caller's rate-limit headers where the gateway is on."""
    state = app_state(request)
    record = request_record(request.scope)
    if record.principal is None:
        # A path the guard lets through without a key, whose route asks for one itself
        # (``/openapi.json`` unless public, ``/health?deep=1``).
        record.principal = await authenticate(state, request.headers.get("authorization"))
    if state.gateway is not None:
        admitting = request.scope["path"] in ADMITTING
        await state.gateway.note_caller(record.principal, record, admitting=admitting)
    return record.principal


async def authenticate(state: AppState, authorization: str | None) -> Principal:
    """An ``Authorization`` header's principal: static keys first (no I/O), then the
    gateway's stored keys; AuthenticationError (401) otherwise."""
    if state.gateway is not None:
        return await state.gateway.principal(state.keys, authorization)
    return state.keys.authenticate(authorization)
