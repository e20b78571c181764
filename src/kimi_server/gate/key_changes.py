"""What a create or update sets on a stored key, checked before anything reaches the database."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from kimi_server.gate.key_checks import (
    ModelRules,
    check_budget,
    check_count,
    check_expiry,
    check_period,
    check_tags,
    check_text,
)
from kimi_server.gate.money import usd_to_nanos
from kimi_server.gate.periods import NONE
from kimi_server.policy.output_caps import check_output_cap
from kimi_server.store.models import ApiKeyRow

# What ``clear`` may name, and the column each empties.
CLEARED = {
    "rpm": "rpm",
    "tpm": "tpm",
    "budget": "budget_nanos",
    "expires": "expires_at",
    "models": "models",
    "max_output_tokens": "max_output_tokens",
    "soft_budget": "soft_budget_nanos",
    "team": "team_id",
    "tags": "tags",
}


@dataclass(frozen=True)
class KeyChanges:
    """Fields to set on create or update; ``None`` leaves a field as it is. ``clear`` names
    fields to empty (``CLEARED``)."""

    rpm: int | None = None
    tpm: int | None = None
    budget_usd: Decimal | None = None
    expires_at: datetime | None = None
    models: frozenset[str] | None = None
    max_output_tokens: int | None = None
    budget_period: str | None = None  # daily | weekly | monthly | none
    soft_budget_usd: Decimal | None = None
    team: str | None = None  # a team's name or id
    tags: tuple[str, ...] | None = None
    capture: bool | None = None  # keep the key's prompts and answers
    clear: frozenset[str] = frozenset()
    # A budget on models without a price never bites; set only when the operator means it.
    allow_unpriced_budget: bool = False

    def check(self, rules: ModelRules) -> None:
        check_count(self.rpm, "rpm")
        check_count(self.tpm, "tpm")
        check_output_cap(self.max_output_tokens)
        check_budget(self.budget_usd)
        check_budget(self.soft_budget_usd, "soft_budget_usd")
        check_period(self.budget_period)
        check_expiry(self.expires_at, datetime.now(UTC))
        rules.check_models(self.models)
        check_tags(self.tags)
        if self.team is not None:
            check_text(self.team, "team")

    def touches_spend(self) -> bool:
        return self.budget_usd is not None or self.models is not None or bool({"budget", "models"} & self.clear)


def apply_changes(row: ApiKeyRow, c: KeyChanges, team_id: str | None) -> None:
    """Sets the changes on the row; ``team_id``: the team ``c.team`` names, resolved."""
    plain = {
        "rpm": c.rpm,
        "tpm": c.tpm,
        "max_output_tokens": c.max_output_tokens,
        "capture": c.capture,
        "team_id": team_id,
        "budget_nanos": None if c.budget_usd is None else usd_to_nanos(c.budget_usd),
        "soft_budget_nanos": None if c.soft_budget_usd is None else usd_to_nanos(c.soft_budget_usd),
        "expires_at": None if c.expires_at is None else c.expires_at.astimezone(UTC),  # SQLite keeps no offset
        # Checked: known ids, none holds a comma.
        "models": None if c.models is None else ",".join(sorted(c.models)),
        "tags": None if c.tags is None else ",".join(check_tags(c.tags) or ()),
    }
    for column, value in plain.items():
        if value is not None:
            setattr(row, column, value)
    if c.tags is not None and not c.tags:
        row.tags = None
    if c.budget_period is not None:
        row.budget_period = None if c.budget_period == NONE else c.budget_period
    for name in c.clear:
        setattr(row, CLEARED[name], None)


def changed_fields(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What an update changed, field by field (``[before, after]``), for the audit trail: the
    public view's fields only, so never a secret; spend figures are not changes."""
    moving = {"spent_usd", "period_spent_usd", "period_start", "period_resets_at", "status", "soft_budget_alert"}
    return {
        name: [before.get(name), value]
        for name, value in after.items()
        if name not in moving and before.get(name) != value
    }


def set_fields(view: dict[str, Any]) -> dict[str, Any]:
    """The fields a new key or team was made with (those set), for the audit trail."""
    skip = {"id", "object", "spent_usd", "period_spent_usd", "period_start", "period_resets_at", "status", "created_at"}
    return {k: v for k, v in view.items() if k not in skip and v not in (None, [], False, "none")}
