"""Soft budgets: the first time a key's spend in a budget period reaches its ``soft_budget``,
the operator's webhook is told, once per key and period.

When a request of such a key ends, a cheap test (the key's spend as last read, plus this
request's cost) says whether the soft budget may have been reached; only then, off the request,
the ledger's exact figure is read and, if it is reached, a ``budget_alerts`` row is claimed for
the key and period. The row's primary key makes the claim unique across restarts, workers and
instances: whoever inserts it sends the event (``webhook.py``), recording each attempt on it.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError

from kimi_server.gate.keys import KeyRecord, KeyStore, usd_text
from kimi_server.gate.periods import LIFETIME_START, NONE, period_end, period_start, period_tag, spend_since
from kimi_server.gate.ticket import Ticket
from kimi_server.gate.webhook import Webhook
from kimi_server.store.db import Database, utc
from kimi_server.store.models import ApiKeyRow, BudgetAlertRow

log = logging.getLogger(__name__)
EVENT = "budget.soft_budget_crossed"


class BudgetAlerts:
    def __init__(self, db: Database, keys: KeyStore, webhook: Webhook | None) -> None:
        self.db = db
        self.keys = keys
        self.webhook = webhook
        self._settled: set[tuple[str, datetime]] = set()  # claimed here or elsewhere: nothing left to do
        self._checking: set[tuple[str, datetime]] = set()

    @staticmethod
    def _period(t: Ticket, row: dict[str, Any]) -> datetime:
        return period_start(t.budget_period, row["created_at"]) or LIFETIME_START

    def worth_checking(self, t: Ticket, row: dict[str, Any]) -> bool:
        """Whether this request may have taken its key past its soft budget."""
        if t.soft_budget_nanos is None or not t.stored_key or not row["cost_nanos"]:
            return False
        start = self._period(t, row)
        if (t.key_id, start) in self._settled or (t.key_id, start) in self._checking:
            return False
        # The spend read with the key belongs to the request's period unless that just ended.
        same = t.budget_period is None or period_tag(t.budget_period, start) == t.limits.period
        seen = t.limits.spent_nanos if same else 0
        return bool(seen + row["cost_nanos"] >= t.soft_budget_nanos)

    async def check(self, t: Ticket, row: dict[str, Any]) -> None:
        """The exact check, once the row is committed; the claim and the event if reached."""
        start = self._period(t, row)
        mark = (t.key_id, start)
        if mark in self._checking or mark in self._settled or t.soft_budget_nanos is None:
            return
        self._checking.add(mark)
        try:
            spent = await self._spent(t.key_id, t.budget_period, start)
            if spent < t.soft_budget_nanos:
                return
            claimed = await self._claim(t.key_id, start, t.soft_budget_nanos, spent, row["created_at"])
            self._settled.add(mark)
            if claimed:
                await self._send(t.key_id, start, spent)
        except Exception as exc:  # never the request's problem: it has ended
            log.warning("soft budget check for key %s failed: %s", t.key_id, type(exc).__name__)
        finally:
            self._checking.discard(mark)

    async def _spent(self, key_id: str, period: str | None, start: datetime) -> int:
        async with self.db.engine.connect() as conn:
            if period is not None:
                return await spend_since(conn, key_id, start)
            # A lifetime budget: the key's running total, kept in the ledger's own transaction.
            total = await conn.scalar(select(ApiKeyRow.spent_nanos).where(ApiKeyRow.id == key_id))
            return int(total or 0)

    async def _claim(self, key_id: str, start: datetime, soft: int, spent: int, at: datetime) -> bool:
        row = BudgetAlertRow(
            key_id=key_id, period_start=start, soft_budget_nanos=soft, spent_nanos=spent, crossed_at=at, attempts=0
        )
        async with self.db.sessions() as session:
            session.add(row)
            try:
                await session.commit()
            except IntegrityError:
                return False
        return True

    async def _send(self, key_id: str, start: datetime, spent: int) -> None:
        record = await self.keys.get(key_id)
        if self.webhook is None:
            log.warning("key %s reached its soft budget; no budget_webhook_url is set, so no one is told", key_id)
            await self._note(key_id, start, 0, "no webhook configured")
            return
        body = json.dumps(event_body(record, start, spent), separators=(",", ":")).encode()

        async def note(attempt: int, error: str | None) -> None:
            await self._note(key_id, start, attempt, error)
            if error is not None:
                log.warning("budget webhook attempt %d for key %s failed: %s", attempt, key_id, error)

        if await self.webhook.deliver(EVENT, body, note):
            log.info("budget webhook delivered: key %s reached its soft budget", key_id)
        else:
            log.error("budget webhook for key %s was not delivered", key_id)

    async def _note(self, key_id: str, start: datetime, attempts: int, error: str | None) -> None:
        values: dict[str, Any] = {"attempts": attempts, "last_error": error}
        if error is None:
            values["delivered_at"] = self.keys.clock()
        async with self.db.sessions() as session:
            await session.execute(
                update(BudgetAlertRow)
                .where(BudgetAlertRow.key_id == key_id, BudgetAlertRow.period_start == start)
                .values(**values)
            )
            await session.commit()

    async def state(self, record: KeyRecord) -> dict[str, Any] | None:
        """The soft budget's alert in the key's current period, if it was reached."""
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


def event_body(record: KeyRecord, start: datetime, spent: int) -> dict[str, Any]:
    """The webhook's JSON (docs/gateway.md): which key, which period, what was spent."""
    lifetime = record.budget_period is None
    return {
        "id": f"evt_{record.id}_{int(start.timestamp())}",  # the same on every retry
        "type": EVENT,
        "key_id": record.id,
        "key_name": record.name,
        "budget_period": record.budget_period or NONE,
        "period_start": None if lifetime else start.isoformat(),
        "period_resets_at": None if lifetime else _iso(period_end(record.budget_period, start)),
        "soft_budget_usd": usd_text(record.soft_budget_nanos or 0),
        "max_budget_usd": usd_text(record.budget_nanos) if record.budget_nanos is not None else None,
        "spend_usd": usd_text(spent),
    }
