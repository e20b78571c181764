"""The application factory."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from kimi_server import __version__
from kimi_server.console import install_console
from kimi_server.gate.auth import KeyRing
from kimi_server.gate.gateway import Gateway
from kimi_server.gate.metrics import Metrics
from kimi_server.gate.upstream_metrics import breaker_states
from kimi_server.http import cache_router, chat_router, docs_router, models_router, responses_router
from kimi_server.http.admin_router import router as admin_api
from kimi_server.http.coalesce import CoalesceStreams
from kimi_server.http.direct import DirectRoutes
from kimi_server.http.errors import install_error_handlers
from kimi_server.http.guard import OverloadGuard
from kimi_server.http.key_info_router import router as key_info_api
from kimi_server.http.limits import BodySizeLimit
from kimi_server.http.metrics_router import router as metrics_api
from kimi_server.http.overload import AdmissionSet
from kimi_server.http.request_context import RequestContext
from kimi_server.http.state import AppState, authenticate
from kimi_server.media.intake import MediaIntake
from kimi_server.protocol.chat import ChatCompletionRequest
from kimi_server.protocol.responses import ResponsesRequest
from kimi_server.search.setup import build_searcher
from kimi_server.serving.common import EngineSet
from kimi_server.serving.sealing import Sealer, load_or_create_key
from kimi_server.settings import Settings


def create_app(settings: Settings, engines: EngineSet, keys: KeyRing) -> FastAPI:
    # stored keys, limits, ledger and metrics; off when gateway_enabled is false.
    metrics = Metrics()
    metrics.watch_engines(lambda: [(e.name, e.stats()) for e in engines.unique()])
    metrics.watch_upstreams(lambda: breaker_states(engines.unique()))
    gateway = Gateway(settings, metrics) if settings.gateway_enabled else None

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if gateway is not None:  # migrations run here, before serving
            await gateway.start()
        for engine in engines.unique():
            await engine.start()
        try:
            yield
        finally:
            for engine in engines.unique():
                await engine.close()
            if gateway is not None:  # the ledger drains before exit
                await gateway.close()

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
    app.state.kimi.gateway = gateway
    app.state.kimi_metrics = metrics
    app.state.kimi.searcher = build_searcher(settings)
    app.state.kimi.media = MediaIntake.from_settings(settings)
    install_error_handlers(app)
    app.include_router(chat_router.router)
    app.include_router(responses_router.router)
    app.include_router(models_router.router)
    app.include_router(key_info_api)  # a key's own limits and usage
    app.include_router(docs_router.router)
    app.include_router(cache_router.router)
    # fair admission per engine; the guard checks the key before the body.
    app.state.kimi_admission = AdmissionSet(engines.unique(), settings)
    state: AppState = app.state.kimi
    # the generating routes served without FastAPI's dispatch, once the guard has passed them.
    app.add_middleware(
        DirectRoutes,
        routes={
            "/v1/chat/completions": (ChatCompletionRequest, chat_router.create_chat_completion),
            "/v1/responses": (ResponsesRequest, responses_router.create_response),
        },
    )
    app.add_middleware(OverloadGuard, check_key=lambda raw: authenticate(state, raw), settings=settings)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    # admin API, /metrics, request ids and limit headers on every response.
    app.include_router(admin_api)
    app.include_router(metrics_api)
    install_console(app)  # /console: its own sign-in; / points to it
    app.add_middleware(RequestContext, metrics=metrics)
    app.add_middleware(CoalesceStreams)  # one write per ready batch of events
    return app
