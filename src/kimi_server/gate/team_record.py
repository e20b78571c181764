"""A team as the gateway reads it: its limits, its models, and what its keys spent together.

A team's budget, requests and tokens per minute are shared by all its keys; its models bound
theirs. Its spend in a budget period is the sum of the ledger rows written for it (each row
names the team its key belonged to when it ran), so a key that moves to another team takes no
spend with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from kimi_server.gate.money import budget_view
from kimi_server.gate.periods import period_start
from kimi_server.store.db import utc
from kimi_server.store.models import TeamRow, UsageRow


@dataclass(frozen=True)
class TeamRecord:
    id: str
    name: str
    rpm: int | None
    tpm: int | None
    budget_nanos: int | None
    spent_nanos: int
    budget_period: str | None
    soft_budget_nanos: int | None
    models: frozenset[str] | None
    capture: bool
    created_at: datetime
    period_start: datetime | None = None  # the period period_spent_nanos belongs to
    period_spent_nanos: int = 0

    @property
    def budget_spent_nanos(self) -> int:
        return self.period_spent_nanos if self.budget_period is not None else self.spent_nanos

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "team",
            "name": self.name,
            "rpm": self.rpm,
            "tpm": self.tpm,
            **budget_view(
                self.budget_nanos,
                self.spent_nanos,
                self.budget_period,
                self.period_start,
                self.period_spent_nanos,
                self.soft_budget_nanos,
            ),
            "models": sorted(self.models) if self.models is not None else None,
            "capture": self.capture,
            "created_at": self.created_at.isoformat(),
        }


def models_of(text: str | None) -> frozenset[str] | None:
    return frozenset(text.split(",")) if text else None


def team_record(row: TeamRow, period_spent_nanos: int = 0, start: datetime | None = None) -> TeamRecord:
    return TeamRecord(
        id=row.id,
        name=row.name,
        rpm=row.rpm,
        tpm=row.tpm,
        budget_nanos=row.budget_nanos,
        spent_nanos=row.spent_nanos or 0,
        budget_period=row.budget_period,
        soft_budget_nanos=row.soft_budget_nanos,
        models=models_of(row.models),
        capture=bool(row.capture),
        created_at=utc(row.created_at) or datetime.now(UTC),
        period_start=start,
        period_spent_nanos=period_spent_nanos,
    )


async def team_spend_since(conn: AsyncConnection, team_id: str, start: datetime) -> int:
    """Nano-dollars of the team's ledger rows written at or after ``start``."""
    total = await conn.scalar(
        select(func.coalesce(func.sum(UsageRow.cost_nanos), 0)).where(
            UsageRow.team_id == team_id, UsageRow.created_at >= start
        )
    )
    return int(total or 0)


async def team_with_spend(conn: AsyncConnection, row: TeamRow, now: datetime) -> TeamRecord:
    start = period_start(row.budget_period, now)
    if start is None:
        return team_record(row)
    return team_record(row, await team_spend_since(conn, row.id, start), start)


async def load_team(conn: AsyncConnection, team_id: str | None, now: datetime) -> TeamRecord | None:
    """The team with this id and its spend at ``now``; None for no team (or one deleted)."""
    if team_id is None:
        return None
    found = (await conn.execute(select(TeamRow).where(TeamRow.id == team_id))).first()
    if found is None:
        return None
    return await team_with_spend(conn, TeamRow(**found._mapping), now)
