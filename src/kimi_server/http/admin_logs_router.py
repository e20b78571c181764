"""``/admin/v1/requests`` (the request log, from the ledger) and ``/admin/v1/audit`` (the audit
trail), behind the admin key only."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from fastapi import APIRouter, Depends

from kimi_server.errors import NotFoundError
from kimi_server.gate import audit
from kimi_server.gate.gateway import Gateway
from kimi_server.gate.key_checks import check_text
from kimi_server.gate.request_log import RequestFilter, list_requests, one_request
from kimi_server.http.admin_router import ERRORS, admin_gateway, instant, key_id_of_name, team_id_of_name

router = APIRouter(prefix="/admin/v1", tags=["Admin"], responses=ERRORS)


@router.get("/requests")
async def requests(
    key: str | None = None,
    team: str | None = None,
    tag: str | None = None,
    model: str | None = None,
    status: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    slow_ms: float | None = None,
    failed: bool = False,
    limit: int = 100,
    gw: Gateway = Depends(admin_gateway),
) -> dict[str, Any]:
    """The ledger's requests, newest first: timings, tokens, cost, finish reason and error.
    ``slow_ms``: only those that took longer; ``failed``: only failures."""
    found = RequestFilter(
        key_id=await key_id_of_name(gw, key),
        team_id=await team_id_of_name(gw, team),
        tag=tag,
        model=model,
        status=status,
        since=instant(since, "since"),
        until=instant(until, "until"),
        slow_ms=slow_ms,
        failed=failed,
        limit=limit,
    )
    return {"object": "list", "data": await list_requests(gw.db, found)}


async def request_detail(gw: Gateway, request_id: str) -> dict[str, Any]:
    row = await one_request(gw.db, request_id)
    if row is None:
        raise NotFoundError(f"No request with id '{request_id}' in the ledger.", param="request_id", code="not_found")
    return {**row, "capture": await gw.captures.get(row["request_id"])}


@router.get("/requests/{request_id}")
async def show_request(request_id: str, gw: Gateway = Depends(admin_gateway)) -> dict[str, Any]:
    """One request, with its captured prompt and answer where its key or team captures them."""
    return await request_detail(gw, request_id)


@router.get("/audit")
async def audit_trail(
    since: datetime | None = None,
    action: str | None = None,
    target: str | None = None,
    limit: int = 200,
    gw: Gateway = Depends(admin_gateway),
) -> dict[str, Any]:
    """Administrative actions, newest first: who, when, from where, what changed.
    ``action``: one (``key.rotate``) or a family (``key``, ``team``, ``console``)."""
    for name, value in (("action", action), ("target", target)):
        if value is not None:
            check_text(value, name)
    found = await audit.entries(gw.db, since=instant(since, "since"), action=action, target=target, limit=limit)
    return {"object": "list", "data": found}
