"""The application factory."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from kimi_server import __version__
from kimi_server.console import install_console
from kimi_server.files.service import FileService
from kimi_server.gate.auth import KeyRing
from kimi_server.gate.auth_throttle import AuthThrottle
from kimi_server.gate.gateway import Gateway
from kimi_server.gate.metrics import Metrics
from kimi_server.gate.operator_alerts import OperatorAlerts
from kimi_server.gate.queues import AdmissionSet, server_totals
from kimi_server.gate.upstream_metrics import breaker_states
from kimi_server.http import (
    anthropic_models_router,
    balance_router,
    cache_router,
    chat_router,
    docs_router,
    files_router,
    messages_router,
    models_router,
    responses_router,
    tokenizers_router,
)
from kimi_server.http.admin_logs_router import router as admin_logs_api
from kimi_server.http.admin_router import router as admin_api
from kimi_server.http.admin_teams_router import router as admin_teams_api
from kimi_server.http.coalesce import CoalesceStreams
from kimi_server.http.direct import DirectRoutes
from kimi_server.http.errors import install_error_handlers
from kimi_server.http.guard import OverloadGuard
from kimi_server.http.key_info_router import router as key_info_api
from kimi_server.http.limits import BodySizeLimit
from kimi_server.http.metrics_router import router as metrics_api
from kimi_server.http.request_context import RequestContext
from kimi_server.http.routes import MESSAGES_PATHS
from kimi_server.http.state import authenticate
from kimi_server.media.intake import MediaIntake, media_limits
from kimi_server.protocol.chat import ChatCompletionRequest
from kimi_server.protocol.messages import MessagesRequest
from kimi_server.protocol.responses import ResponsesRequest
from kimi_server.search.setup import build_searcher
from kimi_server.serving.common import EngineSet
from kimi_server.serving.pipeline import Pipeline
from kimi_server.serving.sealing import Sealer, load_or_create_key
from kimi_server.serving.services import Services
from kimi_server.settings import Settings


def create_app(settings: Settings, engines: EngineSet, keys: KeyRing) -> FastAPI:
    # stored keys, limits, ledger and metrics; off when gateway_enabled is false.
    metrics = Metrics()
    metrics.watch_upstreams(lambda: breaker_states(engines.unique()))
    gateway = Gateway(settings, metrics) if settings.gateway_enabled else None
    throttle = AuthThrottle.from_settings(settings, metrics)  # failed keys: slowed, then 429

    # a key about to expire, an upstream's breaker opening: told to the budget webhook.
    alerts = OperatorAlerts(gateway, engines.by_model, settings.key_expiry_alert_days) if gateway else None

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if gateway is not None:  # migrations run here, before serving
            await gateway.start()
        for engine in engines.unique():
            await engine.start()
        if alerts is not None:
            await alerts.start()
        try:
            yield
        finally:
            if alerts is not None:
                await alerts.close()
            for engine in engines.unique():
                await engine.close()
            if gateway is not None:  # the ledger drains before exit
                await gateway.close()
            await throttle.close()

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
    files = FileService.from_settings(settings, media_limits(settings))  # /v1/files, ms://<file_id>
    # fair admission per engine (gate/admission.py); the guard checks the key before the body.
    state = Services(
        settings=settings,
        engines=engines,
        keys=keys,
        sealer=sealer,
        queues=AdmissionSet(engines.unique(), settings),
        throttle=throttle,
        gateway=gateway,
        searcher=build_searcher(settings),
        media=MediaIntake.from_settings(settings, files),
    )
    app.state.kimi = state
    # each engine's figures and its queue's, for /metrics and the console's Live page.
    metrics.watch_engines(lambda: [(row["engine"], row) for row in server_totals(state.queues)])
    app.state.kimi_pipeline = Pipeline(state)
    app.state.kimi_files = files
    app.state.kimi_metrics = metrics
    install_error_handlers(app)
    app.include_router(chat_router.router)
    app.include_router(responses_router.router)
    app.include_router(messages_router.router)
    app.include_router(anthropic_models_router.router)
    app.include_router(models_router.router)
    app.include_router(key_info_api)  # a key's own limits and usage
    app.include_router(docs_router.router)
    app.include_router(cache_router.router)
    app.include_router(files_router.router)
    app.include_router(tokenizers_router.router)
    app.include_router(balance_router.router)
    # the generating routes served without FastAPI's dispatch, once the guard has passed them.
    app.add_middleware(
        DirectRoutes,
        routes={
            "/v1/chat/completions": (ChatCompletionRequest, chat_router.create_chat_completion),
            "/v1/responses": (ResponsesRequest, responses_router.create_response),
            **{path: (MessagesRequest, messages_router.create_message) for path in MESSAGES_PATHS},
        },
    )
    app.add_middleware(
        OverloadGuard, check_key=lambda raw: authenticate(state, raw), throttle=throttle, settings=settings
    )
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes, upload_bytes=files.limits.upload_body_bytes)
    # admin API, /metrics, request ids and limit headers on every response.
    app.include_router(admin_api)
    app.include_router(admin_teams_api)
    app.include_router(admin_logs_api)
    app.include_router(metrics_api)
    install_console(app)  # /console: its own sign-in; / points to it
    app.add_middleware(RequestContext, metrics=metrics)
    app.add_middleware(CoalesceStreams)  # one write per ready batch of events
    return app
