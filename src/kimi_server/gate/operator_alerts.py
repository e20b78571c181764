"""The operator's alerts beside the budget ones (``budget_alerts.py``), sent to the same signed,
retried webhook (``budget_webhook_url``) and claimed in the database so that one event goes out
whatever the number of workers and instances (``alert_claims.py``):

- ``key.expiring``: a stored key expires within ``key_expiry_alert_days``; checked at start and
  every ``EXPIRY_CHECK_SECONDS``, once per key and expiry time. ``kimi_keys_expiring_soon``
  counts such keys, for Prometheus' alert rules.
- ``upstream.breaker_opened``: an upstream's circuit breaker opened from closed (its requests
  now skip it); once per upstream per ``BREAKER_WINDOW``. Each worker and instance keeps its own
  breakers: the first one to see the upstream fail tells.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select

from kimi_server.engines.base import Engine
from kimi_server.gate.alert_claims import AlertClaims, Claim
from kimi_server.gate.gateway import Gateway
from kimi_server.store.db import utc
from kimi_server.store.models import ApiKeyRow

log = logging.getLogger(__name__)
KEY_EVENT = "key.expiring"
BREAKER_EVENT = "upstream.breaker_opened"
EXPIRY_CHECK_SECONDS = 600.0
BREAKER_WINDOW = timedelta(minutes=10)


class OperatorAlerts:
    def __init__(self, gateway: Gateway, by_model: Mapping[str, Engine], expiry_days: float) -> None:
        self.gateway = gateway
        self.claims: AlertClaims = gateway.alerts.claims
        self.by_model = dict(by_model)  # model id -> the engine serving it
        self.window = timedelta(days=expiry_days)
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Watches the breakers, and keys' expiry when ``key_expiry_alert_days`` is above 0."""
        from kimi_server.engines.upstream.engine import UpstreamEngine

        for engine in {id(e): e for e in self.by_model.values()}.values():
            if isinstance(engine, UpstreamEngine):
                models = sorted(m for m, e in self.by_model.items() if e is engine)
                for up in engine.upstreams:
                    up.breaker.on_open = _caller(self._spawn, self._breaker_opened, engine.name, up, models)
        if self.window > timedelta(0):
            self._spawn(self._watch_expiry())

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    # -- keys about to expire ------------------------------------------------------------------

    async def _watch_expiry(self) -> None:
        while True:
            try:
                await self.check_expiring()
            except Exception as exc:  # the next round tries again; serving goes on
                log.warning("key expiry check failed: %s", type(exc).__name__)
            await asyncio.sleep(EXPIRY_CHECK_SECONDS)

    async def check_expiring(self) -> int:
        """Tells of every key expiring within the window not told of yet; the number expiring."""
        now = self.gateway.now()
        query = select(ApiKeyRow.id, ApiKeyRow.name, ApiKeyRow.expires_at).where(
            ApiKeyRow.revoked_at.is_(None), ApiKeyRow.expires_at > now, ApiKeyRow.expires_at <= now + self.window
        )
        async with self.gateway.db.engine.connect() as conn:
            rows = (await conn.execute(query)).all()
        self.gateway.metrics.keys_expiring.set(len(rows))
        for key_id, name, expires in rows:
            expires_at: datetime = utc(expires)  # type: ignore[assignment]  # SQLite keeps no offset
            claim = Claim.of("expiry", key_id, expires_at)
            if await self.claims.claim(claim, at=now):
                event = {
                    "id": f"evt_expiring_{key_id}_{int(expires_at.timestamp())}",
                    "type": KEY_EVENT,
                    "key_id": key_id,
                    "key_name": name,
                    "expires_at": expires_at.isoformat(),
                    "expires_in_seconds": int((expires_at - now).total_seconds()),
                }
                await self.claims.send(claim, event, f"key {key_id} expires at {expires_at.isoformat()}")
        return len(rows)

    # -- breakers ------------------------------------------------------------------------------

    async def _breaker_opened(self, engine: str, up: Any, models: list[str]) -> None:
        now = datetime.now(UTC)
        window = BREAKER_WINDOW.total_seconds()
        start = datetime.fromtimestamp(now.timestamp() // window * window, UTC)
        claim = Claim.of("upstream", up.name, start)
        try:
            if not await self.claims.claim(claim, at=now):
                return
            event = {
                "id": f"evt_breaker_{claim.subject.split(':', 1)[1]}_{int(start.timestamp())}",
                "type": BREAKER_EVENT,
                "engine": engine,
                "upstream": up.name,
                "models": models,
                "opened_at": now.isoformat(),
                "failures": up.breaker.threshold,
                "cooldown_seconds": up.breaker.cooldown,
            }
            await self.claims.send(claim, event, f"upstream {up.name}'s circuit breaker opened")
        except Exception as exc:  # never the request's problem
            log.warning("breaker alert for %s failed: %s", up.name, type(exc).__name__)


def _caller(spawn: Any, work: Any, *args: Any) -> Any:
    """A no-argument callback that starts ``work(*args)`` in the running loop (breakers call it
    from inside a request)."""

    def call() -> None:
        spawn(work(*args))

    return call
