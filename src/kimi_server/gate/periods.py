"""Budget periods: when a key's budget starts over, in UTC.

``daily`` starts at 00:00, ``weekly`` on Monday at 00:00, ``monthly`` on the 1st at 00:00;
``None`` (shown as ``none``) is one period for the key's whole life. What a key has spent in a
period is the sum of its ledger rows since the period began (``spend_since``), so a new period
needs no job: the old rows simply stop counting.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from kimi_server.store.models import UsageRow

PERIODS = ("daily", "weekly", "monthly")
NONE = "none"  # the spelling of no period in the API and the CLI
# The alert record of a key without a period: its one "period" starts here.
LIFETIME_START = datetime(1970, 1, 1, tzinfo=UTC)


def period_start(period: str | None, at: datetime) -> datetime | None:
    """The start of the period holding ``at``; None for a lifetime budget."""
    if period is None:
        return None
    day = at.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "daily":
        return day
    if period == "weekly":
        return day - timedelta(days=day.weekday())
    return day.replace(day=1)


def period_end(period: str | None, start: datetime | None) -> datetime | None:
    """When the period that began at ``start`` ends (the next one starts); None: never."""
    if period is None or start is None:
        return None
    if period == "daily":
        return start + timedelta(days=1)
    if period == "weekly":
        return start + timedelta(days=7)
    return start.replace(year=start.year + 1, month=1) if start.month == 12 else start.replace(month=start.month + 1)


def period_tag(period: str | None, start: datetime | None) -> int:
    """A number naming one period of one kind, for the limiters: 0 for a lifetime budget.
    The kind is part of it, so a key switched between kinds starts over from the ledger."""
    if period is None or start is None:
        return 0
    return int(start.timestamp()) * 4 + PERIODS.index(period) + 1


async def spend_since(conn: AsyncConnection, key_id: str, start: datetime) -> int:
    """Nano-dollars of the key's ledger rows written at or after ``start``."""
    total = await conn.scalar(
        select(func.coalesce(func.sum(UsageRow.cost_nanos), 0)).where(
            UsageRow.key_id == key_id, UsageRow.created_at >= start
        )
    )
    return int(total or 0)
