"""Budget alerts: the first time a key's (or a team's) spend in a budget period reaches its
``soft_budget``, and the first time it reaches its budget (its requests are refused from then on
until the period starts over), the operator's webhook is told, once per key or team, period and
threshold.

When a request ends, a cheap test (the spend as last read, plus this request's cost) says
whether a threshold may have been reached; only then, off the request, the ledger's exact figure
is read and, if it is reached, the alert is claimed in the database (``alert_claims.py``):
whoever claims it sends the event, recording each attempt on it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import select

from kimi_server.gate.alert_claims import AlertClaims, Claim
from kimi_server.gate.key_record import KeyRecord
from kimi_server.gate.keys import KeyStore
from kimi_server.gate.money import usd_text
from kimi_server.gate.periods import LIFETIME_START, NONE, period_end, period_start, period_tag, spend_since
from kimi_server.gate.reservation import Reservation
from kimi_server.gate.team_record import TeamRecord, team_spend_since
from kimi_server.gate.teams import TeamStore
from kimi_server.gate.webhook import Webhook
from kimi_server.store.db import Database, utc
from kimi_server.store.models import ApiKeyRow, BudgetAlertRow, TeamRow

log = logging.getLogger(__name__)
EVENT = "budget.soft_budget_crossed"
SPENT_EVENT = "budget.spent"


@dataclass(frozen=True)
class Threshold:
    kind: Literal["soft", "spent"]
    nanos: int

    def claim(self, owner: str, start: datetime) -> Claim:
        # A soft budget's row is the owner's own (key or team id); the others are prefixed.
        return Claim(owner, start) if self.kind == "soft" else Claim.of("spent", owner, start)


@dataclass(frozen=True)
class Watched:
    """A budget a request counted against that has a threshold: its key's, or its team's."""

    kind: Literal["key", "team"]
    id: str  # the key's or the team's
    period: str | None
    thresholds: tuple[Threshold, ...]
    seen_spent: int  # the spend read with the key, in the period below
    seen_period: int  # periods.period_tag of that period


def _thresholds(soft: int | None, budget: int | None) -> tuple[Threshold, ...]:
    found = [Threshold("soft", soft)] if soft is not None else []
    if budget is not None:
        found.append(Threshold("spent", budget))
    return tuple(found)


def watched(t: Reservation) -> list[Watched]:
    found = []
    key = _thresholds(t.soft_budget_nanos, t.limits.budget_nanos) if t.stored_key else ()
    if key:
        found.append(Watched("key", t.key_id, t.budget_period, key, t.limits.spent_nanos, t.limits.period))
    team_limits = t.team_limits
    if t.team_id is not None and team_limits is not None:
        team = _thresholds(t.team_soft_budget_nanos, team_limits.budget_nanos)
        if team:
            found.append(
                Watched("team", t.team_id, t.team_budget_period, team, team_limits.spent_nanos, team_limits.period)
            )
    return found


class BudgetAlerts:
    def __init__(self, db: Database, keys: KeyStore, webhook: Webhook | None, teams: TeamStore | None = None) -> None:
        self.db = db
        self.keys = keys
        self.teams = teams or TeamStore(db)
        self.webhook = webhook
        self.claims = AlertClaims(db, webhook, keys.clock)
        self._settled: set[tuple[str, str, datetime]] = set()  # claimed here or elsewhere: nothing left to do
        self._checking: set[tuple[str, datetime]] = set()

    @staticmethod
    def _period(w: Watched, row: dict[str, Any]) -> datetime:
        return period_start(w.period, row["created_at"]) or LIFETIME_START

    def worth_checking(self, t: Reservation, row: dict[str, Any]) -> bool:
        """Whether this request may have taken its key or its team past a threshold."""
        return bool(row["cost_nanos"]) and any(self._waiting(w, row, cheap=True) for w in watched(t))

    def _waiting(self, w: Watched, row: dict[str, Any], *, cheap: bool) -> list[Threshold]:
        """The thresholds not yet settled (``cheap``: and that the spend as last read, plus this
        request's cost, may have reached)."""
        start = self._period(w, row)
        if (w.id, start) in self._checking:
            return []
        # The spend read with the key belongs to the request's period unless that just ended.
        same = w.period is None or period_tag(w.period, start) == w.seen_period
        seen = (w.seen_spent if same else 0) + row["cost_nanos"]
        return [
            th for th in w.thresholds if (w.id, th.kind, start) not in self._settled and (not cheap or seen >= th.nanos)
        ]

    async def check(self, t: Reservation, row: dict[str, Any]) -> None:
        """The exact checks, once the row is committed; the claim and the event for each reached."""
        for w in watched(t):
            waiting = self._waiting(w, row, cheap=False)
            if waiting:
                await self._check(w, waiting, row)

    async def _check(self, w: Watched, waiting: list[Threshold], row: dict[str, Any]) -> None:
        start = self._period(w, row)
        mark = (w.id, start)
        self._checking.add(mark)
        try:
            spent = await self._spent(w, start)
            for th in waiting:
                if spent >= th.nanos:
                    await self._reached(w, th, start, spent, row["created_at"])
        except Exception as exc:  # never the request's problem: it has ended
            log.warning("budget check for %s %s failed: %s", w.kind, w.id, type(exc).__name__)
        finally:
            self._checking.discard(mark)

    async def _reached(self, w: Watched, th: Threshold, start: datetime, spent: int, at: datetime) -> None:
        claim = th.claim(w.id, start)
        claimed = await self.claims.claim(claim, threshold=th.nanos, amount=spent, at=at)
        self._settled.add((w.id, th.kind, start))
        if not claimed:
            return
        owner: KeyRecord | TeamRecord = await (self.keys.get(w.id) if w.kind == "key" else self.teams.get(w.id))
        if th.kind == "soft":
            await self.claims.send(claim, event_body(owner, start, spent), f"{w.kind} {w.id} reached its soft budget")
        else:
            await self.claims.send(claim, spent_body(owner, start, spent), f"{w.kind} {w.id} spent its budget")

    async def _spent(self, w: Watched, start: datetime) -> int:
        async with self.db.engine.connect() as conn:
            if w.period is not None:
                since = spend_since if w.kind == "key" else team_spend_since
                return await since(conn, w.id, start)
            # A lifetime budget: the running total, kept in the ledger's own transaction.
            column = ApiKeyRow.spent_nanos if w.kind == "key" else TeamRow.spent_nanos
            owner = ApiKeyRow.id if w.kind == "key" else TeamRow.id
            total = await conn.scalar(select(column).where(owner == w.id))
            return int(total or 0)

    async def state(self, record: KeyRecord | TeamRecord) -> dict[str, Any] | None:
        """The soft budget's alert in the key's (or team's) current period, if it was reached."""
        start = record.period_start or (LIFETIME_START if record.budget_period is None else None)
        if record.soft_budget_nanos is None or start is None:
            return None
        async with self.db.sessions() as session:
            row = await session.get(BudgetAlertRow, (record.id, start))
        if row is None:
            return None
        return {
            "reached_at": _iso(row.crossed_at),
            "spend_at_alert": usd_text(row.spent_nanos),
            "webhook_attempts": row.attempts,
            "delivered_at": _iso(row.delivered_at),
            "last_error": row.last_error,
        }

    def stop(self) -> None:
        if self.webhook is not None:
            self.webhook.stop()

    async def close(self) -> None:
        if self.webhook is not None:
            await self.webhook.close()


def _iso(at: datetime | None) -> str | None:
    return utc(at).isoformat() if at is not None else None  # type: ignore[union-attr]


def _owner_fields(owner: KeyRecord | TeamRecord, start: datetime) -> dict[str, Any]:
    lifetime = owner.budget_period is None
    kind = "key" if isinstance(owner, KeyRecord) else "team"
    return {
        f"{kind}_id": owner.id,
        f"{kind}_name": owner.name,
        "budget_period": owner.budget_period or NONE,
        "period_start": None if lifetime else start.isoformat(),
        "period_resets_at": None if lifetime else _iso(period_end(owner.budget_period, start)),
    }


def event_body(owner: KeyRecord | TeamRecord, start: datetime, spent: int) -> dict[str, Any]:
    """The soft budget's event (docs/gateway.md): which key or team, which period, what was spent."""
    return {
        "id": f"evt_{owner.id}_{int(start.timestamp())}",  # the same on every retry
        "type": EVENT,
        **_owner_fields(owner, start),
        "soft_budget_usd": usd_text(owner.soft_budget_nanos or 0),
        "max_budget_usd": usd_text(owner.budget_nanos) if owner.budget_nanos is not None else None,
        "spend_usd": usd_text(spent),
    }


def spent_body(owner: KeyRecord | TeamRecord, start: datetime, spent: int) -> dict[str, Any]:
    """A budget spent: the requests are refused (429) until ``period_resets_at``."""
    return {
        "id": f"evt_spent_{owner.id}_{int(start.timestamp())}",
        "type": SPENT_EVENT,
        **_owner_fields(owner, start),
        "max_budget_usd": usd_text(owner.budget_nanos or 0),
        "spend_usd": usd_text(spent),
    }
