"""A stored key as the gateway reads it: its limits, its team, its tags, and its spend."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from kimi_server.gate.money import budget_view, iso
from kimi_server.gate.team_record import TeamRecord, models_of
from kimi_server.store.db import utc
from kimi_server.store.models import ApiKeyRow


@dataclass(frozen=True)
class KeyRecord:
    id: str
    name: str
    rpm: int | None
    tpm: int | None
    budget_nanos: int | None
    spent_nanos: int
    models: frozenset[str] | None
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    max_output_tokens: int | None = None  # for requests that name no cap; None: the model's
    budget_period: str | None = None  # daily | weekly | monthly; None: the budget is for life
    soft_budget_nanos: int | None = None
    # The period the figure below belongs to (None: lifetime), and the ledger's spend in it.
    period_start: datetime | None = None
    period_spent_nanos: int = 0
    team: TeamRecord | None = None  # its limits bound the key's; None: no team
    tags: tuple[str, ...] = ()
    capture: bool = False  # the key's own switch; its team's may capture it too
    # After a rotation: until when the replaced secret is still accepted.
    previous_expires_at: datetime | None = None

    @property
    def budget_spent_nanos(self) -> int:
        """What counts against the budget: the period's spend, or all of it."""
        return self.period_spent_nanos if self.budget_period is not None else self.spent_nanos

    @property
    def captures(self) -> bool:
        """Whether this key's prompts and answers are kept (its own switch, or its team's)."""
        return self.capture or (self.team is not None and self.team.capture)

    def usable(self, at: datetime) -> bool:
        return self.revoked_at is None and (self.expires_at is None or self.expires_at > at)

    def allows(self, model: str) -> bool:
        """Whether the key, and its team, may use ``model``."""
        if self.models is not None and model not in self.models:
            return False
        return self.team is None or self.team.models is None or model in self.team.models

    def status(self, now: datetime) -> str:
        if self.revoked_at:
            return "revoked"
        return "expired" if self.expires_at and self.expires_at <= now else "active"

    def as_dict(self) -> dict[str, object]:
        """The public view (admin API, CLI): never the secret, never its digest."""
        now = datetime.now(UTC)
        previous = self.previous_expires_at if self.previous_expires_at and self.previous_expires_at > now else None
        return {
            "id": self.id,
            "object": "api_key",
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
            "max_output_tokens": self.max_output_tokens,
            "team_id": self.team.id if self.team is not None else None,
            "team": self.team.name if self.team is not None else None,
            "tags": list(self.tags),
            "capture": self.capture,
            "previous_secret_expires_at": iso(previous),
            "created_at": self.created_at.isoformat(),
            "expires_at": iso(self.expires_at),
            "revoked_at": iso(self.revoked_at),
            "status": self.status(now),
        }


def tags_of(text: str | None) -> tuple[str, ...]:
    return tuple(text.split(",")) if text else ()


def key_record(
    row: ApiKeyRow, period_spent_nanos: int = 0, start: datetime | None = None, team: TeamRecord | None = None
) -> KeyRecord:
    return KeyRecord(
        id=row.id,
        name=row.name,
        rpm=row.rpm,
        tpm=row.tpm,
        budget_nanos=row.budget_nanos,
        spent_nanos=row.spent_nanos,
        models=models_of(row.models),
        created_at=utc(row.created_at) or datetime.now(UTC),
        expires_at=utc(row.expires_at),
        revoked_at=utc(row.revoked_at),
        max_output_tokens=row.max_output_tokens,
        budget_period=row.budget_period,
        soft_budget_nanos=row.soft_budget_nanos,
        period_start=start,
        period_spent_nanos=period_spent_nanos,
        team=team,
        tags=tags_of(row.tags),
        capture=bool(row.capture),
        previous_expires_at=utc(row.previous_expires_at),
    )
