"""``/admin/v1/teams``: teams of keys with a shared budget, limits and models (the admin key only)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any, Literal

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field

from kimi_server.gate.audit import Actor
from kimi_server.gate.gateway import Gateway
from kimi_server.gate.key_checks import MAX_BUDGET_USD, MAX_COUNT, MAX_NAME_CHARS
from kimi_server.gate.team_record import TeamRecord
from kimi_server.gate.teams import TeamChanges
from kimi_server.http.admin_router import ERRORS, admin_actor, admin_gateway

router = APIRouter(prefix="/admin/v1", tags=["Admin"], responses=ERRORS)


class TeamFields(BaseModel):
    # Shared by every key of the team; a key's own limits apply as well (the tighter wins).
    rpm: int | None = Field(default=None, ge=1, le=MAX_COUNT, strict=True)
    tpm: int | None = Field(default=None, ge=1, le=MAX_COUNT, strict=True)
    budget_usd: Decimal | None = Field(default=None, ge=0, le=MAX_BUDGET_USD)
    budget_period: str | None = Field(default=None, max_length=16)  # none | daily | weekly | monthly
    soft_budget_usd: Decimal | None = Field(default=None, ge=0, le=MAX_BUDGET_USD)
    models: list[str] | None = Field(default=None, max_length=100)
    capture: bool | None = None  # keep the prompts and answers of every key of the team
    allow_unpriced_budget: bool = False

    def changes(self, clear: frozenset[str] = frozenset()) -> TeamChanges:
        return TeamChanges(
            rpm=self.rpm,
            tpm=self.tpm,
            budget_usd=self.budget_usd,
            budget_period=self.budget_period,
            soft_budget_usd=self.soft_budget_usd,
            models=frozenset(self.models) if self.models is not None else None,
            capture=self.capture,
            clear=clear,
            allow_unpriced_budget=self.allow_unpriced_budget,
        )


class TeamCreate(TeamFields):
    name: str = Field(min_length=1, max_length=MAX_NAME_CHARS)


class TeamUpdate(TeamFields):
    clear: list[Literal["rpm", "tpm", "budget", "soft_budget", "models"]] = Field(default_factory=list)


async def _shown(gw: Gateway, record: TeamRecord) -> dict[str, Any]:
    return {**record.as_dict(), "soft_budget_alert": await gw.alerts.state(record)}


@router.post("/teams")
async def create_team(
    body: TeamCreate, gw: Gateway = Depends(admin_gateway), actor: Actor = Depends(admin_actor)
) -> dict[str, Any]:
    """Creates a team; keys join it with ``team`` on create or update."""
    return await _shown(gw, await gw.teams.create(body.name, body.changes(), actor))


@router.get("/teams")
async def list_teams(gw: Gateway = Depends(admin_gateway)) -> dict[str, Any]:
    """Every team, with what its keys spent (all of it, and in its budget period)."""
    return {"object": "list", "data": [await _shown(gw, t) for t in await gw.teams.list()]}


@router.get("/teams/{team}")
async def show_team(team: str, gw: Gateway = Depends(admin_gateway)) -> dict[str, Any]:
    """One team, by id or name."""
    return await _shown(gw, await gw.teams.get(team))


@router.patch("/teams/{team}")
async def update_team(
    team: str, body: TeamUpdate, gw: Gateway = Depends(admin_gateway), actor: Actor = Depends(admin_actor)
) -> dict[str, Any]:
    """Changes a team's budget, limits, models or capture; ``clear`` removes them."""
    return await _shown(gw, await gw.teams.update(team, body.changes(frozenset(body.clear)), actor))


@router.delete("/teams/{team}")
async def delete_team(
    team: str, gw: Gateway = Depends(admin_gateway), actor: Actor = Depends(admin_actor)
) -> dict[str, Any]:
    """Deletes a team without active keys (400 ``team_not_empty`` otherwise)."""
    return {**(await gw.teams.delete(team, actor)).as_dict(), "deleted": True}
