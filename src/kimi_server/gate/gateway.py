"""The gateway in one object: stored keys, per-key limits and budgets, metering, metrics.

The admission step (``http/admit.py``) makes two calls (see docs/gateway.md):

    ticket = await gateway.reserve(record, principal, gen, endpoint)   # before the engine
    engine = gateway.metered(engine, ticket)                            # wraps its events

This module authenticates keys and reserves for requests: ``reserve`` refuses with 404 (a
model the key may not use) or 429 (requests, tokens, budget) and otherwise reserves. The end of a
request (ledger row, settling, the soft-budget check) is ``metering.py``'s.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime

from fastapi import Request

from kimi_server.engines.base import Engine
from kimi_server.engines.types import GenerationRequest
from kimi_server.errors import AuthenticationError, NotFoundError, RateLimitError
from kimi_server.gate.auth import KeyRing, Principal
from kimi_server.gate.budget_alerts import BudgetAlerts
from kimi_server.gate.key_checks import ModelRules
from kimi_server.gate.key_hash import KEY_PREFIX
from kimi_server.gate.keys import KeyStore
from kimi_server.gate.ledger import Ledger
from kimi_server.gate.limits import Limiter, Limits, LocalLimiter
from kimi_server.gate.metering import Meter, MeteredEngine
from kimi_server.gate.metrics import Metrics
from kimi_server.gate.periods import period_end, period_start, period_tag
from kimi_server.gate.prices import PriceBook
from kimi_server.gate.redis_limits import RedisLimiter
from kimi_server.gate.ticket import RequestRecord, Ticket
from kimi_server.gate.webhook import Webhook
from kimi_server.policy.prompt_size import estimate_prompt_tokens
from kimi_server.printable import visible
from kimi_server.settings import Settings
from kimi_server.store.db import Database

log = logging.getLogger(__name__)


class LimitExceeded(RateLimitError):
    """429 naming the limit: ``type`` requests | tokens | insufficient_quota."""

    def __init__(self, message: str, *, kind: str, code: str) -> None:
        super().__init__(message, code=code)
        self.error_type = kind


def limits_of(principal: Principal, now: datetime | None = None) -> Limits:
    """The key's limits at ``now``: a periodic budget counts what was spent in its period."""
    r = principal.record
    if r is None:
        return Limits()
    if r.budget_period is None:
        return Limits(r.rpm, r.tpm, r.budget_nanos, r.spent_nanos)
    start = period_start(r.budget_period, now or datetime.now(UTC))
    # A key read in the previous period (the lookup cache) has spent nothing in this one yet.
    spent = r.period_spent_nanos if r.period_start == start else 0
    return Limits(r.rpm, r.tpm, r.budget_nanos, spent, period_tag(r.budget_period, start))


class Gateway:
    def __init__(self, settings: Settings, metrics: Metrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.db = Database.from_settings(settings.database_url, settings.data_dir, settings.sqlite_synchronous)
        # The time periods and ledger rows are dated by; tests may set another.
        self.clock: Callable[[], datetime] = lambda: datetime.now(UTC)
        self.keys = KeyStore(self.db, settings.key_cache_seconds, ModelRules.from_settings(settings), self.now)
        self.ledger = Ledger(self.db, settings.ledger_batch_ms / 1000)
        self.prices = PriceBook(settings.prices)
        url, secret = settings.budget_webhook_url, settings.budget_webhook_secret
        self.alerts = BudgetAlerts(self.db, self.keys, Webhook(url, secret) if url and secret else None)
        limiter: Limiter = (
            RedisLimiter(settings.redis_url, settings.redis_prefix, self.metrics.set_degraded)
            if settings.redis_url
            else LocalLimiter()
        )
        self.meter = Meter(self.prices, self.metrics, self.ledger, limiter, self.alerts, self.now)

    def now(self) -> datetime:
        return self.clock()

    @property
    def limiter(self) -> Limiter:
        return self.meter.limiter

    @limiter.setter
    def limiter(self, limiter: Limiter) -> None:  # workers share theirs through a file
        self.meter.limiter = limiter

    async def start(self) -> None:
        await self.db.migrate()
        for record, unpriced in await self.keys.unpriced_budgets():
            log.warning(
                "key %s (%s) has a budget, but no price is configured for %s: its spend there "
                "stays 0 and the budget never bites",
                record.id,
                visible(record.name),
                ", ".join(unpriced),
            )
        self.ledger.start()

    async def close(self) -> None:
        self.alerts.stop()  # a webhook still failing is not retried past shutdown
        await self.meter.close()
        await self.alerts.close()
        await self.ledger.close()
        await self.limiter.close()
        await self.db.close()

    async def principal(self, static: KeyRing, authorization: str | None) -> Principal:
        """Static keys first (no I/O), then stored keys."""
        try:
            return static.authenticate(authorization)
        except AuthenticationError:
            token = (authorization or "").partition(" ")[2].strip()
            if not token.startswith(KEY_PREFIX):
                raise
            record = await self.keys.lookup(token)
            if record is None:
                raise
            return Principal(key_id=record.id, record=record)

    async def note_caller(self, principal: Principal, record: RequestRecord, *, admitting: bool) -> None:
        """Puts the caller on the request's record, with its rate-limit headers. ``admitting``:
        the route reserves for the request, and takes the headers from its reservation (no
        second round trip)."""
        record.key_id = principal.key_id
        limits = limits_of(principal, self.now())
        if (limits.rpm or limits.tpm) and not admitting:
            snap = await self.limiter.peek(principal.key_id, limits)
            record.ratelimit_headers = snap.headers()

    def check_model(self, principal: Principal, model: str) -> None:
        """A key limited to some models sees the others as if they did not exist."""
        allowed = principal.record.models if principal.record else None
        if allowed is not None and model not in allowed:
            raise NotFoundError(f"The model '{model}' does not exist or you do not have access to it.", param="model")

    async def reserve(
        self,
        record: RequestRecord,
        principal: Principal,
        gen: GenerationRequest,
        endpoint: str,
        prompt_tokens: int | None = None,
    ) -> Ticket:
        """``prompt_tokens``: the engine's own count of the prompt, where it can tell; else a
        generous estimate is reserved."""
        self.check_model(principal, gen.model)
        record.model = gen.model
        limits = limits_of(principal, self.now())
        estimate = prompt_tokens if prompt_tokens is not None else estimate_prompt_tokens(gen)
        ticket = Ticket(
            request_id=record.request_id,
            client_request_id=record.client_request_id,
            key_id=principal.key_id,
            stored_key=principal.record is not None,
            limits=limits,
            model=gen.model,
            endpoint=endpoint,
            cache_ttl=gen.cache.ttl_label,
            prompt_estimate=estimate,
            reserved_tokens=estimate + gen.max_output_tokens,
            hold_nanos=self.prices.worst_case_nanos(gen.model, estimate, gen.max_output_tokens, gen.cache.ttl_label),
            budget_period=principal.record.budget_period if principal.record else None,
            soft_budget_nanos=principal.record.soft_budget_nanos if principal.record else None,
        )
        if not limits.any:
            return ticket
        decision = await self.limiter.reserve(ticket.key_id, limits, ticket.reserved_tokens, ticket.hold_nanos)
        headers = decision.snapshot.headers()
        if decision.admitted:
            ticket.reserved = True
            record.ratelimit_headers = headers
            return ticket
        headers["retry-after"] = str(max(1, int(decision.retry_after + 0.999)))
        record.ratelimit_headers = headers
        self.metrics.rejections.labels(decision.reason or "unknown").inc()
        if decision.reason == "quota":
            headers.pop("retry-after")
            raise LimitExceeded(self._quota_message(ticket), kind="insufficient_quota", code="insufficient_quota")
        if decision.reason == "requests":
            raise LimitExceeded(
                f"Rate limit reached for requests per minute (limit {limits.rpm}). "
                f"Try again in {decision.retry_after:.1f}s.",
                kind="requests",
                code="rate_limit_exceeded",
            )
        raise LimitExceeded(
            f"Rate limit reached for tokens per minute (limit {limits.tpm}). Try again in {decision.retry_after:.1f}s.",
            kind="tokens",
            code="rate_limit_exceeded",
        )

    def _quota_message(self, t: Ticket) -> str:
        if t.budget_period is None:
            return "You exceeded your current quota: this key's budget is spent."
        resets = period_end(t.budget_period, period_start(t.budget_period, self.now()))
        assert resets is not None
        return (
            f"You exceeded your current quota: this key's {t.budget_period} budget is spent; "
            f"it starts over at {resets.isoformat()}."
        )

    def refund(self, ticket: Ticket) -> None:
        """Gives back what ``reserve`` reserved for a request that never reached the engine."""
        if not ticket.reserved:
            return
        ticket.reserved = False
        self.meter.spawn(
            self.limiter.settle(ticket.key_id, ticket.limits, ticket.reserved_tokens, ticket.hold_nanos, 0)
        )

    def metered(
        self, engine: Engine, ticket: Ticket, request: Request | None = None, *, searches: int = 0
    ) -> MeteredEngine:
        return MeteredEngine(engine, self.meter, ticket, request, searches)
