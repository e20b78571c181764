"""The gateway in one object: stored keys, per-key limits and budgets, metering, metrics.

The admission pass (``gate/admit.py``) makes two calls (see docs/gateway.md):

    reservation = await gateway.reserve(record, principal, gen, endpoint)   # before the engine
    engine = gateway.metered(engine, reservation, record)                    # wraps its events

This module authenticates keys and reserves for requests: ``reserve`` refuses with 404 (a
model the key may not use) or 429 (requests, tokens, budget) and otherwise reserves. The end of a
request (ledger row, settling, the soft-budget check) is ``metering.py``'s.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import NoReturn

from kimi_server.engines.base import Engine
from kimi_server.engines.types import GenerationRequest
from kimi_server.errors import AuthenticationError, NotFoundError, RateLimitError
from kimi_server.gate.auth import KeyRing, Principal
from kimi_server.gate.budget_alerts import BudgetAlerts
from kimi_server.gate.capture_engine import CapturingEngine
from kimi_server.gate.captures import CaptureStore
from kimi_server.gate.key_checks import ModelRules
from kimi_server.gate.key_hash import KEY_PREFIX
from kimi_server.gate.key_record import KeyRecord
from kimi_server.gate.keys import KeyStore
from kimi_server.gate.ledger import Ledger
from kimi_server.gate.limits import Decision, Limiter, Limits, LocalLimiter, Snapshot, tighter
from kimi_server.gate.metering import Meter, MeteredEngine
from kimi_server.gate.metrics import Metrics
from kimi_server.gate.periods import period_end, period_start, period_tag
from kimi_server.gate.prices import PriceBook
from kimi_server.gate.redis_limits import RedisLimiter
from kimi_server.gate.request_record import RequestRecord
from kimi_server.gate.reservation import Reservation
from kimi_server.gate.team_record import TeamRecord
from kimi_server.gate.teams import TeamStore
from kimi_server.gate.webhook import Webhook
from kimi_server.policy.prompt_size import estimate_prompt_tokens
from kimi_server.printable import visible
from kimi_server.settings import Settings
from kimi_server.store.db import Database

log = logging.getLogger(__name__)
END_USER_CHARS = 256  # the ledger column's width


class LimitExceeded(RateLimitError):
    """429 naming the limit: ``type`` requests | tokens | insufficient_quota | budget_held."""

    def __init__(self, message: str, *, kind: str, code: str) -> None:
        super().__init__(message, code=code)
        self.error_type = kind


def possible_output(cap: int, prompt_tokens: int, window: int | None) -> int:
    """The most output a request can produce: its cap, bounded by what the engine's context
    leaves after the prompt (a default cap of 131,072 tokens is far more than most engines
    can hold, and a budget held for it would refuse requests it could pay for)."""
    if window is None:
        return cap
    return max(1, min(cap, window - prompt_tokens))


def limits_of(principal: Principal, now: datetime | None = None) -> Limits:
    """The key's limits at ``now``: a periodic budget counts what was spent in its period."""
    r = principal.record
    if r is None:
        return Limits()
    return _limits(r, now or datetime.now(UTC))


def team_limits_of(principal: Principal, now: datetime | None = None) -> Limits | None:
    """The limits of the key's team, shared by all its keys; None: no team."""
    team = principal.record.team if principal.record is not None else None
    return None if team is None else _limits(team, now or datetime.now(UTC))


def _limits(r: KeyRecord | TeamRecord, now: datetime) -> Limits:
    if r.budget_period is None:
        return Limits(r.rpm, r.tpm, r.budget_nanos, r.spent_nanos)
    start = period_start(r.budget_period, now)
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
        rules = ModelRules.from_settings(settings)
        self.keys = KeyStore(self.db, settings.key_cache_seconds, rules, self.now)
        self.teams = TeamStore(self.db, rules)
        self.ledger = Ledger(self.db, settings.ledger_batch_ms / 1000)
        self.prices = PriceBook(settings.prices)
        url, secret = settings.budget_webhook_url, settings.budget_webhook_secret
        self.alerts = BudgetAlerts(self.db, self.keys, Webhook(url, secret) if url and secret else None, self.teams)
        limiter: Limiter = (
            RedisLimiter(settings.redis_url, settings.redis_prefix, self.metrics.set_degraded)
            if settings.redis_url
            else LocalLimiter()
        )
        self.meter = Meter(self.prices, self.metrics, self.ledger, limiter, self.alerts, self.now)
        self.captures = CaptureStore(self.db, settings.capture_retention_days, self.meter.spawn, self.now)

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
        await self.captures.prune()
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
            record.ratelimit_headers, record.ratelimit = snap.headers(), snap

    def check_model(self, principal: Principal, model: str) -> None:
        """A key limited to some models (or in a team that is) sees the others as if they did
        not exist."""
        if principal.record is not None and not principal.record.allows(model):
            raise NotFoundError(f"The model '{model}' does not exist or you do not have access to it.", param="model")

    async def reserve(
        self,
        record: RequestRecord,
        principal: Principal,
        gen: GenerationRequest,
        endpoint: str,
        prompt_tokens: int | None = None,
        window: int | None = None,
    ) -> Reservation:
        """``prompt_tokens``: the engine's own count of the prompt, where it can tell; else a
        generous estimate is reserved. ``window``: the engine's context (prompt and output
        together), which bounds the output reserved below the request's cap. A key in a team
        holds the team's limits and budget as well as its own: the tighter of the two refuses."""
        self.check_model(principal, gen.model)
        record.model = gen.model
        ticket = self._ticket(record, principal, gen, endpoint, prompt_tokens, window)
        snapshot = None
        if ticket.limits.any:
            decision = await self.limiter.reserve(
                ticket.key_id, ticket.limits, ticket.reserved_tokens, ticket.hold_nanos
            )
            if not decision.admitted:
                self._refuse(record, ticket, decision, decision.snapshot, team=False)
            ticket.reserved = True
            snapshot = decision.snapshot
        team_limits = ticket.team_limits
        if ticket.team_id is not None and team_limits is not None and team_limits.any:
            decision = await self.limiter.reserve(
                ticket.team_id, team_limits, ticket.reserved_tokens, ticket.hold_nanos
            )
            shown = decision.snapshot if snapshot is None else tighter(snapshot, decision.snapshot)
            if not decision.admitted:
                await self._undo_key(ticket)
                self._refuse(record, ticket, decision, shown, team=True)
            ticket.team_reserved = True
            snapshot = shown
        if snapshot is not None:
            record.ratelimit, record.ratelimit_headers = snapshot, snapshot.headers()
        return ticket

    def _ticket(
        self,
        record: RequestRecord,
        principal: Principal,
        gen: GenerationRequest,
        endpoint: str,
        prompt_tokens: int | None,
        window: int | None,
    ) -> Reservation:
        now = self.now()
        key = principal.record
        team = key.team if key is not None else None
        estimate = prompt_tokens if prompt_tokens is not None else estimate_prompt_tokens(gen)
        output = possible_output(gen.max_output_tokens, estimate, window)
        return Reservation(
            request_id=record.request_id,
            client_request_id=record.client_request_id,
            key_id=principal.key_id,
            stored_key=key is not None,
            limits=limits_of(principal, now),
            model=gen.model,
            endpoint=endpoint,
            cache_ttl=gen.cache.ttl_label,
            prompt_estimate=estimate,
            reserved_tokens=estimate + output,
            hold_nanos=self.prices.worst_case_nanos(gen.model, estimate, output, gen.cache.ttl_label),
            budget_period=key.budget_period if key else None,
            soft_budget_nanos=key.soft_budget_nanos if key else None,
            end_user=gen.end_user[:END_USER_CHARS] if gen.end_user else None,
            team_id=team.id if team else None,
            team_limits=team_limits_of(principal, now),
            team_budget_period=team.budget_period if team else None,
            team_soft_budget_nanos=team.soft_budget_nanos if team else None,
            capture=key.captures if key else False,
        )

    async def _undo_key(self, ticket: Reservation) -> None:
        """Gives back the key's whole reservation (its request too): the team refused."""
        if ticket.reserved:
            ticket.reserved = False
            limits, tokens, hold = ticket.limits, ticket.reserved_tokens, ticket.hold_nanos
            await self.limiter.settle(ticket.key_id, limits, tokens, hold, 0, requests=1)

    def _refuse(
        self, record: RequestRecord, ticket: Reservation, decision: Decision, shown: Snapshot, *, team: bool
    ) -> NoReturn:
        headers = shown.headers()
        headers["retry-after"] = str(max(1, int(decision.retry_after + 0.999)))
        record.ratelimit, record.ratelimit_headers = shown, headers
        self.metrics.rejections.labels(decision.reason or "unknown").inc()
        limits = ticket.team_limits if team and ticket.team_limits is not None else ticket.limits
        whose = "this key's team's" if team else "this key's"
        if decision.reason == "quota":
            headers.pop("retry-after")
            period = ticket.team_budget_period if team else ticket.budget_period
            raise LimitExceeded(
                self._quota_message(period, whose), kind="insufficient_quota", code="insufficient_quota"
            )
        if decision.reason == "held":
            raise LimitExceeded(
                f"Requests in flight hold the rest of {whose} budget until they end (each holds its "
                f"most possible cost and settles at its real one). Try again in {decision.retry_after:.1f}s.",
                kind="budget_held",
                code="rate_limit_exceeded",
            )
        if decision.reason == "requests":
            raise LimitExceeded(
                f"Rate limit reached for requests per minute (limit {limits.rpm}{' for the team' if team else ''}). "
                f"Try again in {decision.retry_after:.1f}s.",
                kind="requests",
                code="rate_limit_exceeded",
            )
        raise LimitExceeded(
            f"Rate limit reached for tokens per minute (limit {limits.tpm}{' for the team' if team else ''}). "
            f"Try again in {decision.retry_after:.1f}s.",
            kind="tokens",
            code="rate_limit_exceeded",
        )

    async def count_request(self, record: RequestRecord, principal: Principal) -> None:
        """One request against the key's per-minute limit, for a free route (token counting):
        nothing is held against its tokens or budget. 429 past the limit."""
        limits = limits_of(principal, self.now())
        if limits.rpm is None:
            return
        requests_only = Limits(rpm=limits.rpm)
        decision = await self.limiter.reserve(principal.key_id, requests_only, 0, 0)
        record.ratelimit_headers, record.ratelimit = decision.snapshot.headers(), decision.snapshot
        if decision.admitted:
            return
        record.ratelimit_headers["retry-after"] = str(max(1, int(decision.retry_after + 0.999)))
        self.metrics.rejections.labels("requests").inc()
        raise LimitExceeded(
            f"Rate limit reached for requests per minute (limit {limits.rpm}). "
            f"Try again in {decision.retry_after:.1f}s.",
            kind="requests",
            code="rate_limit_exceeded",
        )

    def _quota_message(self, period: str | None, whose: str) -> str:
        if period is None:
            return f"You exceeded your current quota: {whose} budget is spent."
        resets = period_end(period, period_start(period, self.now()))
        assert resets is not None
        return (
            f"You exceeded your current quota: {whose} {period} budget is spent; "
            f"it starts over at {resets.isoformat()}."
        )

    def refund(self, ticket: Reservation) -> None:
        """Gives back what ``reserve`` reserved for a request that never reached the engine."""
        tokens, hold = ticket.reserved_tokens, ticket.hold_nanos
        if ticket.reserved:
            ticket.reserved = False
            self.meter.spawn(self.limiter.settle(ticket.key_id, ticket.limits, tokens, hold, 0))
        if ticket.team_reserved and ticket.team_id is not None and ticket.team_limits is not None:
            ticket.team_reserved = False
            self.meter.spawn(self.limiter.settle(ticket.team_id, ticket.team_limits, tokens, hold, 0))

    def metered(
        self, engine: Engine, ticket: Reservation, record: RequestRecord | None = None, *, searches: int = 0
    ) -> MeteredEngine:
        return MeteredEngine(engine, self.meter, ticket, record, searches)

    def captured(self, engine: Engine, ticket: Reservation) -> CapturingEngine:
        """The engine of a request whose prompt and answer are kept (``ticket.capture``)."""
        return CapturingEngine(engine, self.captures, ticket.request_id, ticket.key_id)
