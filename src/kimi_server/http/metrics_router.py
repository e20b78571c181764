"""``GET /metrics`` in Prometheus text format.

It shows every key's traffic, so it is for operators: the admin key reads it, tenant keys are
refused (403), and ``metrics_public`` opens it to anyone (a scraper on a private network).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from kimi_server.errors import APIError, AuthenticationError, PermissionDeniedError
from kimi_server.http.admin_key import as_counted, bearer_token, is_admin_key
from kimi_server.http.state import app_state, authenticate

router = APIRouter(include_in_schema=False)


def metrics_refusal(admin_key: str | None, authorization: str | None) -> APIError | None:
    """Why this ``Authorization`` header may not read /metrics, or None."""
    token = bearer_token(authorization)
    if token is None:
        return AuthenticationError("/metrics needs the admin key as 'Authorization: Bearer ADMIN_KEY'.")
    if not is_admin_key(token, admin_key):
        return PermissionDeniedError(
            "Only the admin key may read /metrics (or the server is started with metrics_public = true)."
        )
    return None


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    state = app_state(request)
    if not state.settings.metrics_public:
        authorization = request.headers.get("authorization")

        async def check() -> APIError | None:
            refusal = metrics_refusal(state.settings.admin_key, authorization)
            return await as_counted(refusal, authorization, lambda raw: authenticate(state, raw))

        # A wrong admin key here counts as one on /admin/ does (gate/auth_throttle.py).
        refusal = await state.throttle.screen(request.scope, bearer_token(authorization), "admin", check)
        if refusal is not None:
            raise refusal
    gateway_metrics = request.app.state.kimi_metrics
    return Response(gateway_metrics.render(), media_type=CONTENT_TYPE_LATEST)
