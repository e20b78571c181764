"""The audit trail (the admin key only): who changed keys and teams, who signed in, newest
first; read through the admin API's own route function (``http/admin_logs_router.py``)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from kimi_server.console.session import Viewer, admin_viewer
from kimi_server.console.web import error_text, page
from kimi_server.errors import APIError
from kimi_server.http import admin_logs_router
from kimi_server.http.state import app_state

router = APIRouter(prefix="/console/audit", include_in_schema=False)
ACTIONS = ("key", "team", "console")


@router.get("")
async def audit_trail(
    request: Request, action: str = "", target: str = "", who: Viewer = Depends(admin_viewer)
) -> Response:
    gw = app_state(request).gateway
    assert gw is not None  # an admin viewer exists only with the gateway on
    error = None
    try:
        body = await admin_logs_router.audit_trail(action=action or None, target=target or None, limit=500, gw=gw)
        entries = body["data"]
    except APIError as exc:
        entries, error = [], error_text(exc)
    chosen = {"action": action, "target": target}
    return page(request, "audit.html", who, entries=entries, chosen=chosen, actions=ACTIONS, error=error)
