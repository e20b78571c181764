"""The request log (the admin key only): the ledger's requests filtered by key, team, tag,
model, status, time, duration and failure; a page per request with its timings, tokens, cost,
finish reason or error, and its captured prompt and answer where its key or team keeps them.
Read through the admin API's own route functions (``http/admin_logs_router.py``)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from kimi_server.console.keys_pages import served_models
from kimi_server.console.session import Viewer, admin_viewer
from kimi_server.console.web import error_text, page
from kimi_server.errors import APIError, InvalidRequestError
from kimi_server.gate.gateway import Gateway
from kimi_server.gate.request_log import STATUSES
from kimi_server.http import admin_logs_router, admin_router, admin_teams_router
from kimi_server.http.state import app_state

router = APIRouter(prefix="/console/requests", include_in_schema=False)
FILTERS = ("key", "team", "tag", "model", "status", "since", "until", "slow_ms", "failed")


def _gateway(request: Request) -> Gateway:
    gw = app_state(request).gateway
    assert gw is not None  # an admin viewer exists only with the gateway on
    return gw


def _time(raw: str, param: str) -> datetime | None:
    """A ``datetime-local`` value (no zone) read as UTC."""
    if not raw:
        return None
    try:
        at = datetime.fromisoformat(raw)
    except ValueError:
        raise InvalidRequestError(f"'{param}' is not a date and time.", param=param) from None
    return at if at.tzinfo else at.replace(tzinfo=UTC)


def _number(raw: str, param: str) -> float | None:
    if not raw:
        return None
    try:
        return float(raw)
    except ValueError:
        raise InvalidRequestError(f"'{param}' must be a number of milliseconds.", param=param) from None


async def _rows(gw: Gateway, chosen: dict[str, str]) -> list[dict[str, Any]]:
    body = await admin_logs_router.requests(
        key=chosen["key"] or None,
        team=chosen["team"] or None,
        tag=chosen["tag"] or None,
        model=chosen["model"] or None,
        status=chosen["status"] or None,
        since=_time(chosen["since"], "since"),
        until=_time(chosen["until"], "until"),
        slow_ms=_number(chosen["slow_ms"], "slow_ms"),
        failed=chosen["failed"] in ("on", "true", "1"),
        limit=200,
        gw=gw,
    )
    rows: list[dict[str, Any]] = body["data"]
    return rows


@router.get("")
async def request_log(request: Request, who: Viewer = Depends(admin_viewer)) -> Response:
    gw = _gateway(request)
    chosen = {name: request.query_params.get(name, "").strip() for name in FILTERS}
    error = None
    try:
        rows = await _rows(gw, chosen)
    except APIError as exc:
        rows, error = [], error_text(exc)
    keys = (await admin_router.list_keys(gw))["data"]
    teams = (await admin_teams_router.list_teams(gw))["data"]
    context = {"keys": keys, "teams": teams, "models": served_models(request), "statuses": STATUSES}
    status = 400 if error else 200
    return page(request, "requests.html", who, status=status, rows=rows, chosen=chosen, error=error, **context)


@router.get("/{request_id}")
async def one_request(request: Request, request_id: str, who: Viewer = Depends(admin_viewer)) -> Response:
    try:
        shown = await admin_logs_router.request_detail(_gateway(request), request_id)
    except APIError as exc:
        return page(request, "denied.html", who, status=exc.status_code, reason=error_text(exc))
    return page(request, "request.html", who, r=shown)
