"""What the routers need at request time, kept on ``app.state``."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from kimi_server.gate.auth import KeyRing, Principal
from kimi_server.gate.gateway import Gateway
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
    """Dependency for every route but health."""
    state = app_state(request)
    # stored keys too, and the caller's rate-limit headers.
    if state.gateway is not None:
        return await state.gateway.authenticate(state.keys, request)
    return state.keys.authenticate(request.headers.get("authorization"))
