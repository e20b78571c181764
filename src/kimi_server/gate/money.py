"""Money as the store keeps it (integer nano-dollars) and as people read it (decimal USD), and
the budget figures a key and a team both show."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

from kimi_server.gate.periods import NONE, period_end

NANOS = Decimal(1_000_000_000)


def usd_to_nanos(usd: Decimal) -> int:
    return int((usd * NANOS).to_integral_value())


def nanos_to_usd(nanos: int) -> Decimal:
    return (Decimal(nanos) / NANOS).normalize()


def usd_text(nanos: int) -> str:
    """An amount as people write it: "10", "0.000000001" (never "1E+1" or "1E-9")."""
    return format(nanos_to_usd(nanos), "f")


def optional_usd(nanos: int | None) -> str | None:
    return usd_text(nanos) if nanos is not None else None


def iso(at: datetime | None) -> str | None:
    return at.isoformat() if at is not None else None


def budget_view(
    budget_nanos: int | None,
    spent_nanos: int,
    period: str | None,
    start: datetime | None,
    period_spent_nanos: int,
    soft_budget_nanos: int | None,
) -> dict[str, Any]:
    """A budget's public figures: the same fields for a key and a team."""
    return {
        "budget_usd": optional_usd(budget_nanos),
        "spent_usd": usd_text(spent_nanos),
        "budget_period": period or NONE,
        "period_start": iso(start),
        "period_resets_at": iso(period_end(period, start)),
        "period_spent_usd": usd_text(period_spent_nanos if period is not None else spent_nanos),
        "soft_budget_usd": optional_usd(soft_budget_nanos),
    }
