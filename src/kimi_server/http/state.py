"""What the routers need at request time, kept on ``app.state``."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from kimi_server.gate.auth import KeyRing, Principal
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
    searcher: Searcher | None = None  # Web search (issue 11): None when no provider
    media: MediaIntake | None = None  # Media input (issue 11)


def app_state(request: Request) -> AppState:
    state: AppState = request.app.state.kimi
    return state


def authenticated(request: Request) -> Principal:
    """Dependency for every route but health."""
    return app_state(request).keys.authenticate(request.headers.get("authorization"))
