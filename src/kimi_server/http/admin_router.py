"""``/admin/v1/`` keys and usage, behind the admin key only (teams, the request log and the audit
trail: ``admin_teams_router.py``, ``admin_logs_router.py``).

Without ``admin_key`` configured the admin API is off: every call is refused with 403.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Literal

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, Field

from kimi_server.errors import NotFoundError
from kimi_server.gate.audit import Actor, client_host
from kimi_server.gate.gateway import Gateway
from kimi_server.gate.key_checks import (
    MAX_BUDGET_USD,
    MAX_COUNT,
    MAX_GRACE_SECONDS,
    MAX_NAME_CHARS,
    MAX_TAGS,
    check_instant,
    check_text,
)
from kimi_server.gate.keys import KeyChanges, KeyRecord
from kimi_server.gate.request_record import request_record
from kimi_server.gate.usage import usage_totals
from kimi_server.http.admin_key import ADMIN_KEY_ID, admin_key_refusal
from kimi_server.http.state import app_state
from kimi_server.policy.output_caps import MAX_OUTPUT_TOKENS
from kimi_server.protocol.common import ErrorBody


def admin_gateway(request: Request) -> Gateway:
    state = app_state(request)
    admin = state.settings.admin_key if state.gateway is not None else None
    refusal = admin_key_refusal(admin, request.headers.get("authorization"))
    if refusal is not None:
        raise refusal
    assert state.gateway is not None  # without a gateway there is no admin key to accept
    request_record(request.scope).key_id = ADMIN_KEY_ID
    return state.gateway


def admin_actor(request: Request) -> Actor:
    """Who makes an admin API call, for the audit trail: the admin key, from the client's address."""
    return Actor("admin_api", "admin key", client_host(request.scope))


ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorBody} for code in (400, 401, 403, 404)}
router = APIRouter(prefix="/admin/v1", tags=["Admin"], responses=ERRORS)


class KeyFields(BaseModel):
    # Bounds of the columns (gate/key_checks.py); the rest is checked there, for the CLI too.
    rpm: int | None = Field(default=None, ge=1, le=MAX_COUNT, strict=True)
    tpm: int | None = Field(default=None, ge=1, le=MAX_COUNT, strict=True)
    # Output tokens of this key's requests that name no cap.
    max_output_tokens: int | None = Field(default=None, ge=1, le=MAX_OUTPUT_TOKENS, strict=True)
    budget_usd: Decimal | None = Field(default=None, ge=0, le=MAX_BUDGET_USD)
    # none | daily | weekly | monthly (UTC); checked in gate/key_checks.py, for the CLI too.
    budget_period: str | None = Field(default=None, max_length=16)
    soft_budget_usd: Decimal | None = Field(default=None, ge=0, le=MAX_BUDGET_USD)
    expires_at: datetime | None = None
    models: list[str] | None = Field(default=None, max_length=100)
    team: str | None = Field(default=None, max_length=MAX_NAME_CHARS)  # a team's name or id
    tags: list[str] | None = Field(default=None, max_length=MAX_TAGS)
    capture: bool | None = None  # keep this key's prompts and answers (capture_retention_days)
    allow_unpriced_budget: bool = False  # keep a budget even where some models have no price

    def changes(self, clear: frozenset[str] = frozenset()) -> KeyChanges:
        return KeyChanges(
            rpm=self.rpm,
            tpm=self.tpm,
            budget_usd=self.budget_usd,
            expires_at=self.expires_at,
            models=frozenset(self.models) if self.models is not None else None,
            clear=clear,
            max_output_tokens=self.max_output_tokens,
            budget_period=self.budget_period,
            soft_budget_usd=self.soft_budget_usd,
            team=self.team,
            tags=tuple(self.tags) if self.tags is not None else None,
            capture=self.capture,
            allow_unpriced_budget=self.allow_unpriced_budget,
        )


class KeyCreate(KeyFields):
    name: str = Field(min_length=1, max_length=MAX_NAME_CHARS)


class KeyUpdate(KeyFields):
    clear: list[
        Literal["rpm", "tpm", "budget", "expires", "models", "max_output_tokens", "soft_budget", "team", "tags"]
    ] = Field(default_factory=list)


class KeyRotate(BaseModel):
    # Seconds the replaced secret is still accepted (0: refused at once).
    grace_seconds: int = Field(default=0, ge=0, le=MAX_GRACE_SECONDS, strict=True)


@router.post("/keys")
async def create_key(
    body: KeyCreate, gw: Gateway = Depends(admin_gateway), actor: Actor = Depends(admin_actor)
) -> dict[str, Any]:
    """Creates a key. The response is the only place its secret ever appears."""
    record, secret = await gw.keys.create(body.name, body.changes(), actor)
    return {**record.as_dict(), "secret": secret}


async def _shown(gw: Gateway, record: KeyRecord) -> dict[str, Any]:
    """The key's public view, with its soft budget's alert in the current period (or null)."""
    return {**record.as_dict(), "soft_budget_alert": await gw.alerts.state(record)}


@router.get("/keys")
async def list_keys(gw: Gateway = Depends(admin_gateway)) -> dict[str, Any]:
    """Every key, with its spend so far (all of it, and in its budget period); never a secret."""
    return {"object": "list", "data": [await _shown(gw, r) for r in await gw.keys.list()]}


@router.get("/keys/{key}")
async def show_key(key: str, gw: Gateway = Depends(admin_gateway)) -> dict[str, Any]:
    """One key, by id or name."""
    return await _shown(gw, await gw.keys.get(key))


@router.patch("/keys/{key}")
async def update_key(
    key: str, body: KeyUpdate, gw: Gateway = Depends(admin_gateway), actor: Actor = Depends(admin_actor)
) -> dict[str, Any]:
    """Changes a key's limits, team, tags or capture; ``clear`` removes them
    (``budget_period: "none"``: a lifetime budget)."""
    return await _shown(gw, await gw.keys.update(key, body.changes(frozenset(body.clear)), actor))


@router.delete("/keys/{key}")
async def revoke_key(
    key: str, gw: Gateway = Depends(admin_gateway), actor: Actor = Depends(admin_actor)
) -> dict[str, Any]:
    """Revokes a key: every instance refuses it within a second. Its usage rows stay."""
    return (await gw.keys.revoke(key, actor)).as_dict()


@router.post("/keys/{key}/rotate")
async def rotate_key(
    key: str, body: KeyRotate, gw: Gateway = Depends(admin_gateway), actor: Actor = Depends(admin_actor)
) -> dict[str, Any]:
    """A new secret for the key, which keeps its id, limits, team and history; the old secret
    is accepted for ``grace_seconds`` more. The response is the only place the new secret appears."""
    record, secret = await gw.keys.rotate(key, body.grace_seconds, actor)
    return {**record.as_dict(), "secret": secret}


async def key_id_of_name(gw: Gateway, key: str | None) -> str | None:
    """A stored key's id by name or id; anything else is taken as a static key's id."""
    if key is None:
        return None
    check_text(key, "key")
    try:
        return (await gw.keys.get(key)).id
    except NotFoundError:
        return key


async def team_id_of_name(gw: Gateway, team: str | None) -> str | None:
    """A team's id by name or id; an unknown one may be a deleted team's id (its rows stay)."""
    if team is None:
        return None
    check_text(team, "team")
    try:
        return (await gw.teams.get(team)).id
    except NotFoundError:
        return team


def instant(value: datetime | None, param: str) -> datetime | None:
    """A time from a query string; without a zone it is UTC."""
    if value is None:
        return None
    return check_instant(value if value.tzinfo else value.replace(tzinfo=UTC), param)


@router.get("/usage")
async def usage(
    key: str | None = None,
    team: str | None = None,
    since: datetime | None = None,
    by: Literal["model", "key", "day", "team", "tag"] = "model",
    gw: Gateway = Depends(admin_gateway),
) -> dict[str, Any]:
    """Ledger totals, like ``kimi-server usage``."""
    data = await usage_totals(
        gw.db,
        key_id=await key_id_of_name(gw, key),
        team_id=await team_id_of_name(gw, team),
        since=instant(since, "since"),
        by=by,
    )
    return {"object": "list", "data": data}
