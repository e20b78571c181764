"""``GET /v1/key/info``: the calling key's own limits, budget and usage.

Shaped after LiteLLM's ``GET /key/info`` (a ``key`` and an ``info`` object with ``key_name``,
``spend``, ``max_budget``, ``models``, ``rpm_limit``, ``tpm_limit``, ``expires``, and for a
budget that starts over, ``spend`` within the period and ``budget_reset_at``), so clients that
already read that can read this. It only ever answers about the key that made the call.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from fastapi import APIRouter, Depends, Request

from kimi_server.gate.auth import Principal
from kimi_server.gate.gateway import Gateway, limits_of
from kimi_server.gate.keys import KeyRecord, usd_text
from kimi_server.gate.periods import NONE, period_end
from kimi_server.gate.team_record import TeamRecord
from kimi_server.gate.usage import usage_totals
from kimi_server.http.state import app_state, authenticated
from kimi_server.protocol.common import ErrorBody

router = APIRouter(tags=["Keys"])

# The ledger's split of a key's totals; a key that has made no request reads zeros.
_EMPTY_USAGE: dict[str, Any] = {
    "requests": 0,
    "prompt_tokens": 0,
    "cached_tokens": 0,
    "cache_write_tokens": 0,
    "reasoning_tokens": 0,
    "completion_tokens": 0,
    "web_search_calls": 0,
    "server_counted_requests": 0,
    "server_estimated_requests": 0,
    "cost_usd": "0",
}


async def _usage(gw: Gateway | None, key_id: str) -> dict[str, Any]:
    if gw is None:
        return dict(_EMPTY_USAGE)
    rows = await usage_totals(gw.db, key_id=key_id, by="key")
    if not rows:
        return dict(_EMPTY_USAGE)
    row = dict(rows[0])
    row.pop("key", None)
    row.pop("name", None)
    return row


async def _stored_info(gw: Gateway, record: KeyRecord) -> dict[str, Any]:
    # Read the key again: the request-time copy may be up to a cache period old in its spend.
    fresh = await gw.keys.get(record.id)
    rpm_remaining = tpm_remaining = None
    if fresh.rpm is not None or fresh.tpm is not None:
        snap = await gw.limiter.peek(fresh.id, limits_of(Principal(key_id=fresh.id, record=fresh), gw.now()))
        if fresh.rpm is not None:
            rpm_remaining = max(0, math.floor(snap.requests_left))
        if fresh.tpm is not None:
            tpm_remaining = max(0, math.floor(snap.tokens_left))
    budget = fresh.budget_nanos
    spent = fresh.budget_spent_nanos  # in the budget period (all time for a lifetime budget)
    soft = fresh.soft_budget_nanos
    alert = await gw.alerts.state(fresh)
    return {
        "key_id": fresh.id,
        "key_name": fresh.name,
        "stored": True,
        "models": sorted(fresh.models) if fresh.models is not None else None,
        "rpm_limit": fresh.rpm,
        "tpm_limit": fresh.tpm,
        "rpm_remaining": rpm_remaining,
        "tpm_remaining": tpm_remaining,
        "max_budget": usd_text(budget) if budget is not None else None,
        "spend": usd_text(spent),
        "budget_remaining": usd_text(max(0, budget - spent)) if budget is not None else None,
        "budget_period": fresh.budget_period or NONE,
        "period_start": fresh.period_start.isoformat() if fresh.period_start else None,
        "budget_reset_at": _iso(period_end(fresh.budget_period, fresh.period_start)),
        "total_spend": usd_text(fresh.spent_nanos),
        "soft_budget": usd_text(soft) if soft is not None else None,
        "soft_budget_reached": None if soft is None else (alert is not None or spent >= soft),
        "soft_budget_alert": alert,
        "max_output_tokens": fresh.max_output_tokens,
        "created_at": fresh.created_at.isoformat(),
        "expires": fresh.expires_at.isoformat() if fresh.expires_at else None,
        "tags": list(fresh.tags),
        "team": _team(fresh.team),
    }


def _team(team: TeamRecord | None) -> dict[str, Any] | None:
    """The key's team: its limits and budget, shared by all its keys, bound this key's too."""
    if team is None:
        return None
    return {
        "team_id": team.id,
        "team_name": team.name,
        "models": sorted(team.models) if team.models is not None else None,
        "rpm_limit": team.rpm,
        "tpm_limit": team.tpm,
        "max_budget": usd_text(team.budget_nanos) if team.budget_nanos is not None else None,
        "spend": usd_text(team.budget_spent_nanos),
        "budget_period": team.budget_period or NONE,
        "budget_reset_at": _iso(period_end(team.budget_period, team.period_start)),
    }


def _iso(at: datetime | None) -> str | None:
    return at.isoformat() if at is not None else None


def _static_info(principal: Principal) -> dict[str, Any]:
    return {
        "key_id": principal.key_id,
        "key_name": None,
        "stored": False,
        "note": "A static key (--api-key): it has no stored limits, budget or expiry.",
        "models": None,
        "rpm_limit": None,
        "tpm_limit": None,
        "rpm_remaining": None,
        "tpm_remaining": None,
        "max_budget": None,
        "spend": None,
        "budget_remaining": None,
        "budget_period": None,
        "period_start": None,
        "budget_reset_at": None,
        "total_spend": None,
        "soft_budget": None,
        "soft_budget_reached": None,
        "soft_budget_alert": None,
        "max_output_tokens": None,
        "created_at": None,
        "expires": None,
        "tags": [],
        "team": None,
    }


@router.get("/v1/key/info", responses={401: {"model": ErrorBody}})
async def key_info(request: Request, principal: Principal = Depends(authenticated)) -> dict[str, Any]:
    """The calling key's own limits, budget, spend and ledger totals (never its secret, never
    another key's). Amounts are decimal USD strings; ``null`` means no limit (``models``:
    every served model). ``team``: the key's team (its limits and budget are shared by its keys
    and bound this one's too), or null. ``spend`` and ``budget_remaining`` are within the key's budget period
    (``budget_period``: none, daily, weekly or monthly in UTC; the next starts at
    ``budget_reset_at``); ``total_spend`` is all time. A static ``--api-key`` key gets
    ``stored: false`` and no limits."""
    gw = app_state(request).gateway
    record = principal.record
    if gw is not None and record is not None:
        info = await _stored_info(gw, record)
    else:
        info = _static_info(principal)
    info["usage"] = await _usage(gw, principal.key_id)
    return {"key": principal.key_id, "info": info}
