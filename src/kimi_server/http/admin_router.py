"""``/admin/v1/`` keys and usage, behind the admin key only.

Without ``admin_key`` configured the admin API is off: every call is refused with 403.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Literal

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, Field

from kimi_server.errors import NotFoundError
from kimi_server.gate.gateway import Gateway
from kimi_server.gate.key_checks import MAX_BUDGET_USD, MAX_COUNT, MAX_NAME_CHARS, check_instant, check_text
from kimi_server.gate.keys import KeyChanges, KeyRecord
from kimi_server.gate.usage import usage_totals
from kimi_server.http.admin_key import admin_key_refusal
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
    return state.gateway


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
            allow_unpriced_budget=self.allow_unpriced_budget,
        )


class KeyCreate(KeyFields):
    name: str = Field(min_length=1, max_length=MAX_NAME_CHARS)


class KeyUpdate(KeyFields):
    clear: list[Literal["rpm", "tpm", "budget", "expires", "models", "max_output_tokens", "soft_budget"]] = Field(
        default_factory=list
    )


@router.post("/keys")
async def create_key(body: KeyCreate, gw: Gateway = Depends(admin_gateway)) -> dict[str, Any]:
    """Creates a key. The response is the only place its secret ever appears."""
    record, secret = await gw.keys.create(body.name, body.changes())
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
async def update_key(key: str, body: KeyUpdate, gw: Gateway = Depends(admin_gateway)) -> dict[str, Any]:
    """Changes a key's limits; ``clear`` removes them (``budget_period: "none"``: a lifetime budget)."""
    return await _shown(gw, await gw.keys.update(key, body.changes(frozenset(body.clear))))


@router.delete("/keys/{key}")
async def revoke_key(key: str, gw: Gateway = Depends(admin_gateway)) -> dict[str, Any]:
    """Revokes a key: every instance refuses it within a second. Its usage rows stay."""
    return (await gw.keys.revoke(key)).as_dict()


@router.get("/usage")
async def usage(
    key: str | None = None,
    since: datetime | None = None,
    by: Literal["model", "key", "day"] = "model",
    gw: Gateway = Depends(admin_gateway),
) -> dict[str, Any]:
    """Ledger totals, like ``kimi-server usage``."""
    if since is not None:
        since = check_instant(since if since.tzinfo else since.replace(tzinfo=UTC), "since")
    key_id = None
    if key is not None:
        check_text(key, "key")
        try:
            key_id = (await gw.keys.get(key)).id
        except NotFoundError:
            key_id = key  # a static key's id
    return {"object": "list", "data": await usage_totals(gw.db, key_id=key_id, since=since, by=by)}
