"""One alert, sent once: a row of the ``budget_alerts`` table is claimed before the operator's
webhook is called, and every attempt is recorded on it. The row's primary key (``key_id``,
``period_start``) makes the claim unique across restarts, workers and instances: whoever
inserts it sends the event (``webhook.py``: signed, retried).

The table was made for soft budgets, whose rows name a key and a budget period. The other
alerts claim rows of their own, told apart by a prefix no key id has (key ids start ``key_``):
``spent:<key id>`` and the budget period for a budget spent, ``expiry:<key id>`` and the expiry
time for a key about to expire, ``upstream:<digest of its name>`` and a time window for an
upstream's breaker opening.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import update
from sqlalchemy.exc import IntegrityError

from kimi_server.gate.webhook import Webhook
from kimi_server.store.db import Database
from kimi_server.store.models import BudgetAlertRow

log = logging.getLogger("kimi_server.gate.alerts")


@dataclass(frozen=True)
class Claim:
    subject: str  # the row's key_id: a key's id (soft budget), or "<kind>:<id>"
    at: datetime  # the row's period_start: which occurrence of the alert

    @staticmethod
    def of(kind: str, name: str, at: datetime) -> Claim:
        """A claim for ``name`` (a key id; an upstream's name is hashed to fit the column)."""
        if kind == "upstream":
            name = hashlib.sha256(name.encode()).hexdigest()[:20]
        return Claim(f"{kind}:{name}", at)


class AlertClaims:
    def __init__(self, db: Database, webhook: Webhook | None, clock: Callable[[], datetime]) -> None:
        self.db = db
        self.webhook = webhook
        self.clock = clock

    async def claim(self, claim: Claim, *, threshold: int = 0, amount: int = 0, at: datetime | None = None) -> bool:
        """True for the one caller that inserted the row (it sends the event)."""
        row = BudgetAlertRow(
            key_id=claim.subject,
            period_start=claim.at,
            soft_budget_nanos=threshold,
            spent_nanos=amount,
            crossed_at=at or self.clock(),
            attempts=0,
        )
        async with self.db.sessions() as session:
            session.add(row)
            try:
                await session.commit()
            except IntegrityError:
                return False
        return True

    async def send(self, claim: Claim, event: dict[str, Any], what: str) -> None:
        """Delivers ``event`` (its ``type`` names it), recording each attempt on the claim's row.
        ``what``: the alert in words, for the log."""
        if self.webhook is None:
            log.warning("%s; no budget_webhook_url is set, so no one is told", what)
            await self._note(claim, 0, "no webhook configured")
            return
        body = json.dumps(event, separators=(",", ":")).encode()

        async def note(attempt: int, error: str | None) -> None:
            await self._note(claim, attempt, error)
            if error is not None:
                log.warning("webhook attempt %d (%s) failed: %s", attempt, event["type"], error)

        if await self.webhook.deliver(event["type"], body, note):
            log.info("webhook delivered: %s", what)
        else:
            log.error("webhook for %s was not delivered", what)

    async def _note(self, claim: Claim, attempts: int, error: str | None) -> None:
        values: dict[str, Any] = {"attempts": attempts, "last_error": error}
        if error is None:
            values["delivered_at"] = self.clock()
        async with self.db.sessions() as session:
            await session.execute(
                update(BudgetAlertRow)
                .where(BudgetAlertRow.key_id == claim.subject, BudgetAlertRow.period_start == claim.at)
                .values(**values)
            )
            await session.commit()
