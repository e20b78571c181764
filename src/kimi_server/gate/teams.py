"""Teams: create, list, show, update, delete. A team's budget (with its period and soft
budget), requests and tokens per minute are shared by its keys, and its models bound theirs
(``gateway.py`` reserves against both). A team with active keys is not deleted; its revoked
keys leave it, and its ledger rows keep its id.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal

from sqlalchemy import func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from kimi_server.errors import InvalidRequestError, NotFoundError
from kimi_server.gate import audit
from kimi_server.gate.audit import Actor
from kimi_server.gate.key_changes import changed_fields, set_fields
from kimi_server.gate.key_checks import (
    ModelRules,
    check_budget,
    check_count,
    check_name,
    check_period,
    check_soft_budget,
    check_text,
)
from kimi_server.gate.money import usd_to_nanos
from kimi_server.gate.periods import NONE
from kimi_server.gate.team_record import TeamRecord, models_of, team_with_spend
from kimi_server.store.db import Database
from kimi_server.store.models import ApiKeyRow, TeamRow

TEAM_CLEARED = {
    "rpm": "rpm",
    "tpm": "tpm",
    "budget": "budget_nanos",
    "soft_budget": "soft_budget_nanos",
    "models": "models",
}


@dataclass(frozen=True)
class TeamChanges:
    """Fields to set; ``None`` leaves a field as it is; ``clear`` names fields to empty."""

    rpm: int | None = None
    tpm: int | None = None
    budget_usd: Decimal | None = None
    budget_period: str | None = None
    soft_budget_usd: Decimal | None = None
    models: frozenset[str] | None = None
    capture: bool | None = None
    clear: frozenset[str] = frozenset()
    allow_unpriced_budget: bool = False

    def check(self, rules: ModelRules) -> None:
        check_count(self.rpm, "rpm")
        check_count(self.tpm, "tpm")
        check_budget(self.budget_usd)
        check_budget(self.soft_budget_usd, "soft_budget_usd")
        check_period(self.budget_period)
        rules.check_models(self.models)

    def apply(self, row: TeamRow) -> None:
        for name in ("rpm", "tpm", "capture"):
            value = getattr(self, name)
            if value is not None:
                setattr(row, name, value)
        if self.budget_usd is not None:
            row.budget_nanos = usd_to_nanos(self.budget_usd)
        if self.soft_budget_usd is not None:
            row.soft_budget_nanos = usd_to_nanos(self.soft_budget_usd)
        if self.budget_period is not None:
            row.budget_period = None if self.budget_period == NONE else self.budget_period
        if self.models is not None:
            row.models = ",".join(sorted(self.models))
        for name in self.clear:
            setattr(row, TEAM_CLEARED[name], None)


async def find_team(session: AsyncSession, name_or_id: str, param: str = "team") -> TeamRow:
    check_text(name_or_id, param)
    row = await session.scalar(select(TeamRow).where(or_(TeamRow.id == name_or_id, TeamRow.name == name_or_id)))
    if row is None:
        raise NotFoundError(f"No team named or with id '{name_or_id}'.", param=param, code="team_not_found")
    return row


class TeamStore:
    def __init__(self, db: Database, rules: ModelRules | None = None) -> None:
        self.db = db
        self.rules = rules or ModelRules.catalogue_only()

    def _check_spend(self, row: TeamRow, changes: TeamChanges) -> None:
        if changes.budget_usd is not None or changes.models is not None or {"budget", "models"} & changes.clear:
            self.rules.check_spend(row.budget_nanos, models_of(row.models), allowed=changes.allow_unpriced_budget)
        check_soft_budget(row.soft_budget_nanos, row.budget_nanos, whose="team")

    async def create(self, name: str, changes: TeamChanges, actor: Actor | None = None) -> TeamRecord:
        check_name(name)
        changes.check(self.rules)
        row = TeamRow(
            id="team_" + secrets.token_hex(8), name=name, spent_nanos=0, capture=False, created_at=datetime.now(UTC)
        )
        changes.apply(row)
        self._check_spend(row, changes)
        async with self.db.sessions() as session:
            session.add(row)
            try:
                await session.flush()
            except IntegrityError:
                raise InvalidRequestError(f"A team named '{name}' already exists.", param="name") from None
            record = await team_with_spend(await session.connection(), row, datetime.now(UTC))
            audit.note(session, actor, "team.create", row.id, set_fields(record.as_dict()))
            await session.commit()
        return record

    async def list(self) -> list[TeamRecord]:
        async with self.db.sessions() as session:
            rows = (await session.scalars(select(TeamRow).order_by(TeamRow.created_at))).all()
            conn = await session.connection()
            now = datetime.now(UTC)
            return [await team_with_spend(conn, row, now) for row in rows]

    async def get(self, name_or_id: str) -> TeamRecord:
        async with self.db.sessions() as session:
            row = await find_team(session, name_or_id, param="team")
            return await team_with_spend(await session.connection(), row, datetime.now(UTC))

    async def update(self, name_or_id: str, changes: TeamChanges, actor: Actor | None = None) -> TeamRecord:
        changes.check(self.rules)
        async with self.db.sessions() as session:
            row = await find_team(session, name_or_id, param="team")
            conn = await session.connection()
            before = (await team_with_spend(conn, row, datetime.now(UTC))).as_dict()
            changes.apply(row)
            self._check_spend(row, changes)
            await session.flush()
            record = await team_with_spend(conn, row, datetime.now(UTC))
            audit.note(session, actor, "team.update", row.id, changed_fields(before, record.as_dict()))
            await session.commit()
            return record

    async def delete(self, name_or_id: str, actor: Actor | None = None) -> TeamRecord:
        """Deletes a team that has no active keys (revoked ones leave it)."""
        async with self.db.sessions() as session:
            row = await find_team(session, name_or_id, param="team")
            members = ApiKeyRow.team_id == row.id
            active = await session.scalar(select(func.count()).where(members, ApiKeyRow.revoked_at.is_(None)))
            if active:
                raise InvalidRequestError(
                    f"The team '{row.name}' still has {active} active key(s): move them to another team "
                    "(or none) or revoke them first.",
                    param="team",
                    code="team_not_empty",
                )
            record = await team_with_spend(await session.connection(), row, datetime.now(UTC))
            await session.execute(update(ApiKeyRow).where(members).values(team_id=None))
            await session.delete(row)
            audit.note(session, actor, "team.delete", row.id, {"name": row.name})
            await session.commit()
            return record
