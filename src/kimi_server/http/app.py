"""The application factory."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from kimi_server import __version__
from kimi_server.gate.auth import KeyRing
from kimi_server.http import cache_router, chat_router, docs_router, models_router, responses_router
from kimi_server.http.errors import install_error_handlers
from kimi_server.http.limits import BodySizeLimit
from kimi_server.http.state import AppState
from kimi_server.media.intake import MediaIntake  # Media input (issue 11)
from kimi_server.search.setup import build_searcher  # Web search (issue 11)
from kimi_server.serving.common import EngineSet
from kimi_server.serving.sealing import Sealer, load_or_create_key
from kimi_server.settings import Settings


def create_app(settings: Settings, engines: EngineSet, keys: KeyRing) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        for engine in engines.unique():
            await engine.start()
        try:
            yield
        finally:
            for engine in engines.unique():
                await engine.close()

    app = FastAPI(
        title="kimi-server",
        version=__version__,
        description="A self-hosted Kimi API: Chat Completions and Responses.",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    key_file = settings.responses_key_file or settings.data_dir / "responses.key"
    sealer = Sealer(load_or_create_key(key_file))
    app.state.kimi = AppState(settings=settings, engines=engines, keys=keys, sealer=sealer)
    # Web search (issue 11)
    app.state.kimi.searcher = build_searcher(settings)
    app.state.kimi.media = MediaIntake.from_settings(settings)  # Media input (issue 11)
    install_error_handlers(app)
    app.include_router(chat_router.router)
    app.include_router(responses_router.router)
    app.include_router(models_router.router)
    app.include_router(docs_router.router)
    app.include_router(cache_router.router)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    return app
