"""Usage and spend from the ledger (by key, team, tag, model and day, split as the ledger splits tokens),
and a key's own page. The admin sees every key; a tenant key only its own figures, read
through the same functions as ``/admin/v1/usage`` and ``/v1/key/info``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from kimi_server.console import charts
from kimi_server.console.session import Viewer, viewer
from kimi_server.console.web import page
from kimi_server.gate.gateway import Gateway
from kimi_server.gate.usage import usage_totals
from kimi_server.http import admin_router, key_info_router
from kimi_server.http.state import app_state

router = APIRouter(prefix="/console", include_in_schema=False)
PERIODS = {"1": "last 24 hours", "7": "last 7 days", "30": "last 30 days", "365": "last year", "all": "all time"}
# The ledger's columns, in the order the tables show them.
COLUMNS = (
    ("requests", "requests"),
    ("prompt_tokens", "prompt"),
    ("cached_tokens", "cached"),
    ("cache_write_tokens", "cache write"),
    ("reasoning_tokens", "reasoning"),
    ("completion_tokens", "output"),
    ("web_search_calls", "web searches"),
    ("cost_usd", "cost (USD)"),
)


async def _totals(gw: Gateway | None, key_id: str | None, since: datetime | None, by: str) -> list[dict[str, Any]]:
    if gw is None:
        return []
    return await usage_totals(gw.db, key_id=key_id, since=since, by=by)  # type: ignore[arg-type]


@router.get("/usage")
async def usage(request: Request, days: str = "30", key: str = "", who: Viewer = Depends(viewer)) -> Response:
    gw = app_state(request).gateway
    days = days if days in PERIODS else "30"
    since = None if days == "all" else datetime.now(UTC) - timedelta(days=int(days))
    keys: list[dict[str, Any]] = []
    if who.admin and gw is not None:
        keys = (await admin_router.list_keys(gw))["data"]
        chosen = next((k["id"] for k in keys if key in (k["id"], k["name"])), key or None)
    else:
        chosen = who.key_id  # a tenant key: its own rows, whatever the address asks for
    by_day = await _totals(gw, chosen, since, "day")
    by_model = await _totals(gw, chosen, since, "model")
    by_key = await _totals(gw, chosen, since, "key") if who.admin else []
    by_team = await _totals(gw, chosen, since, "team") if who.admin else []
    by_tag = await _totals(gw, chosen, since, "tag") if who.admin else []
    budgets = {k["id"]: k for k in keys}
    if not who.admin and gw is not None:
        info = (await key_info_router.key_info(request, who.principal))["info"]  # type: ignore[arg-type]
        budgets = {
            str(who.key_id): {
                "budget_usd": info.get("max_budget"),
                "spent_usd": info.get("spend"),
                "soft_budget_usd": info.get("soft_budget"),
                "budget_period": info.get("budget_period"),
            }
        }
    return page(
        request,
        "usage.html",
        who,
        by_day=by_day,
        by_model=by_model,
        by_key=by_key,
        by_team=by_team,
        by_tag=by_tag,
        keys=keys,
        budgets=budgets,
        chosen=chosen or "",
        days=days,
        periods=PERIODS,
        columns=COLUMNS,
        charts=charts,
    )


@router.get("/me")
async def me(request: Request, who: Viewer = Depends(viewer)) -> Response:
    """What ``GET /v1/key/info`` tells the signed-in key (the admin sees the key list instead)."""
    if who.admin or who.principal is None:
        return page(request, "denied.html", who, status=404, reason="The admin key has no key page: see Keys.")
    body = await key_info_router.key_info(request, who.principal)
    info = dict(body["info"])
    usage_row = info.pop("usage", {})
    return page(request, "me.html", who, info=info, usage=usage_row, columns=COLUMNS, charts=charts)
