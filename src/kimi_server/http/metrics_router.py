"""Gateway (issue 10): ``GET /metrics`` in Prometheus text format; behind a key unless
``metrics_public`` is set."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from kimi_server.http.state import app_state, authenticated

router = APIRouter(include_in_schema=False)


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    state = app_state(request)
    if not state.settings.metrics_public:
        await authenticated(request)
    gateway_metrics = request.app.state.kimi_metrics
    return Response(gateway_metrics.render(), media_type=CONTENT_TYPE_LATEST)
