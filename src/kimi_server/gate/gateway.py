"""The gateway in one object: stored keys, per-key limits and budgets, metering, metrics.

The routers make two calls (see docs/gateway.md):

    ticket = await gateway.admit(request, principal, gen, endpoint)   # before the engine
    engine = gateway.metered(engine, ticket)                           # wraps its events

``admit`` refuses with 404 (a model the key may not use) or 429 (requests, tokens, budget)
and otherwise reserves; the metered engine writes the ledger row when the request ends and
settles the reservation to the real usage, whether it finished, failed or was cut off.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from fastapi import Request

from kimi_server.engines.base import Engine
from kimi_server.engines.types import (
    ContentDelta,
    EngineEvent,
    Finish,
    GenerationRequest,
    ReasoningDelta,
    ToolCallDelta,
    Usage,
)
from kimi_server.errors import NotFoundError, RateLimitError
from kimi_server.gate.auth import KeyRing, Principal
from kimi_server.gate.key_checks import ModelRules
from kimi_server.gate.keys import KeyStore
from kimi_server.gate.ledger import Ledger
from kimi_server.gate.limits import Limiter, Limits, LocalLimiter
from kimi_server.gate.metrics import Metrics
from kimi_server.gate.prices import Billable, PriceBook
from kimi_server.gate.redis_limits import RedisLimiter
from kimi_server.printable import visible
from kimi_server.settings import Settings
from kimi_server.store.db import Database

log = logging.getLogger(__name__)

STATE_HEADERS = "kimi_ratelimit_headers"  # request.state fields the middleware reads
STATE_REQUEST_ID = "kimi_request_id"
STATE_CLIENT_ID = "kimi_client_request_id"
STATE_KEY = "kimi_key_id"
STATE_MODEL = "kimi_model"
STATE_USAGE = "kimi_usage"
ADMITTING_PATHS = frozenset({"/v1/chat/completions", "/v1/responses"})
SETTLE_WAIT = 0.5  # seconds a response waits at most for its limits to settle


class LimitExceeded(RateLimitError):
    """429 naming the limit: ``type`` requests | tokens | insufficient_quota."""

    def __init__(self, message: str, *, kind: str, code: str) -> None:
        super().__init__(message, code=code)
        self.error_type = kind


def estimate_prompt_tokens(gen: GenerationRequest) -> int:
    """A generous guess made before rendering (≈ 3 characters a token, plus framing)."""
    chars = 0
    extra = 0
    for m in gen.messages:
        chars += len(m.text) + len(m.reasoning or "")
        chars += sum(len(c.arguments) + len(c.name) for c in m.tool_calls)
        extra += 8 + 768 * (len(m.images) + len(m.videos))
    for tool in gen.tools:
        chars += len(str(tool.parameters or "")) + len(tool.description or "") + len(tool.name)
    return chars // 3 + extra + 16


@dataclass
class Ticket:
    request_id: str
    client_request_id: str | None
    key_id: str
    stored_key: bool
    limits: Limits
    model: str
    endpoint: str
    cache_ttl: str
    prompt_estimate: int
    reserved_tokens: int
    hold_nanos: int
    started: float = field(default_factory=time.monotonic)
    reserved: bool = False


def limits_of(principal: Principal) -> Limits:
    r = principal.record
    if r is None:
        return Limits()
    return Limits(r.rpm, r.tpm, r.budget_nanos, r.spent_nanos)


class Gateway:
    def __init__(self, settings: Settings, metrics: Metrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.db = Database.from_settings(settings.database_url, settings.data_dir, settings.sqlite_synchronous)
        self.keys = KeyStore(self.db, settings.key_cache_seconds, ModelRules.from_settings(settings))
        self.ledger = Ledger(self.db, settings.ledger_batch_ms / 1000)
        self.prices = PriceBook(settings.prices)
        self.limiter: Limiter = (
            RedisLimiter(settings.redis_url, settings.redis_prefix, self.metrics.set_degraded)
            if settings.redis_url
            else LocalLimiter()
        )
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        await self.db.migrate()
        for record, unpriced in await self.keys.unpriced_budgets():
            log.warning("key %s (%s) has a budget, but no price is configured for %s: its spend there "
                        "stays 0 and the budget never bites", record.id, visible(record.name), ", ".join(unpriced))
        self.ledger.start()

    async def close(self) -> None:
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.ledger.close()
        await self.limiter.close()
        await self.db.close()

    async def principal(self, static: KeyRing, authorization: str | None) -> Principal:
        """Static keys first (no I/O), then stored keys."""
        try:
            return static.authenticate(authorization)
        except Exception:
            token = (authorization or "").partition(" ")[2].strip()
            if not token.startswith("sk-kimi-"):
                raise
            record = await self.keys.lookup(token)
            if record is None:
                raise
            return Principal(key_id=record.id, record=record)

    async def authenticate(self, static: KeyRing, request: Request) -> Principal:
        """The caller's principal; also sets the rate-limit headers."""
        principal = await self.principal(static, request.headers.get("authorization"))
        setattr(request.state, STATE_KEY, principal.key_id)
        limits = limits_of(principal)
        # Routes that admit set the headers from their reservation: no second round trip.
        if (limits.rpm or limits.tpm) and request.url.path not in ADMITTING_PATHS:
            snap = await self.limiter.peek(principal.key_id, limits)
            setattr(request.state, STATE_HEADERS, snap.headers())
        return principal

    def check_model(self, principal: Principal, model: str) -> None:
        """A key limited to some models sees the others as if they did not exist."""
        allowed = principal.record.models if principal.record else None
        if allowed is not None and model not in allowed:
            raise NotFoundError(
                f"The model '{model}' does not exist or you do not have access to it.", param="model"
            )

    async def admit(
        self, request: Request, principal: Principal, gen: GenerationRequest, endpoint: str,
        prompt_tokens: int | None = None,
    ) -> Ticket:
        """``prompt_tokens``: the engine's own count of the prompt, where it can tell; else a
        generous estimate is reserved."""
        self.check_model(principal, gen.model)
        setattr(request.state, STATE_MODEL, gen.model)
        limits = limits_of(principal)
        estimate = prompt_tokens if prompt_tokens is not None else estimate_prompt_tokens(gen)
        ticket = Ticket(
            request_id=getattr(request.state, STATE_REQUEST_ID, None) or "req_" + secrets.token_hex(12),
            client_request_id=getattr(request.state, STATE_CLIENT_ID, None),
            key_id=principal.key_id,
            stored_key=principal.record is not None,
            limits=limits,
            model=gen.model,
            endpoint=endpoint,
            cache_ttl=gen.cache.ttl_label,
            prompt_estimate=estimate,
            reserved_tokens=estimate + gen.max_output_tokens,
            hold_nanos=self.prices.worst_case_nanos(gen.model, estimate, gen.max_output_tokens, gen.cache.ttl_label),
        )
        if not limits.any:
            return ticket
        decision = await self.limiter.reserve(ticket.key_id, limits, ticket.reserved_tokens, ticket.hold_nanos)
        headers = decision.snapshot.headers()
        if decision.admitted:
            ticket.reserved = True
            setattr(request.state, STATE_HEADERS, headers)
            return ticket
        headers["retry-after"] = str(max(1, int(decision.retry_after + 0.999)))
        setattr(request.state, STATE_HEADERS, headers)
        self.metrics.rejections.labels(decision.reason or "unknown").inc()
        if decision.reason == "quota":
            headers.pop("retry-after")
            raise LimitExceeded(
                "You exceeded your current quota: this key's budget is spent.",
                kind="insufficient_quota", code="insufficient_quota",
            )
        if decision.reason == "requests":
            raise LimitExceeded(
                f"Rate limit reached for requests per minute (limit {limits.rpm}). "
                f"Try again in {decision.retry_after:.1f}s.",
                kind="requests", code="rate_limit_exceeded",
            )
        raise LimitExceeded(
            f"Rate limit reached for tokens per minute (limit {limits.tpm}). "
            f"Try again in {decision.retry_after:.1f}s.",
            kind="tokens", code="rate_limit_exceeded",
        )

    def refund(self, ticket: Ticket) -> None:
        """Gives back what ``admit`` reserved for a request that never reached the engine."""
        if not ticket.reserved:
            return
        ticket.reserved = False
        task = asyncio.get_running_loop().create_task(
            self.limiter.settle(ticket.key_id, ticket.limits, ticket.reserved_tokens, ticket.hold_nanos, 0)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def metered(
        self, engine: Engine, ticket: Ticket, request: Request | None = None, *, searches: int = 0
    ) -> MeteredEngine:
        return MeteredEngine(engine, self, ticket, request, searches)

    # -- the end of a request ------------------------------------------------------------------

    def _row(self, t: Ticket, status: str, usage: Usage, searches: int, ttft: float | None) -> dict[str, Any]:
        cost = self.prices.cost_nanos(t.model, Billable(usage, t.cache_ttl, searches))
        return {
            "request_id": t.request_id,
            "client_request_id": t.client_request_id,
            "key_id": t.key_id,
            "model": t.model,
            "endpoint": t.endpoint,
            "status": status,
            "prompt_tokens": usage.prompt_tokens,
            "cached_tokens": usage.cached_tokens,
            "cache_write_tokens": usage.cache_write_tokens,
            "cache_ttl": t.cache_ttl,
            "reasoning_tokens": usage.reasoning_tokens,
            "completion_tokens": usage.completion_tokens,
            "usage_source": usage.source,
            "web_search_calls": searches,
            "cost_nanos": cost,
            "ttft_ms": None if ttft is None else round(ttft * 1000, 3),
            "duration_ms": round((time.monotonic() - t.started) * 1000, 3),
            "created_at": datetime.now(UTC),
        }

    def _account(self, t: Ticket, row: dict[str, Any], ttft: float | None) -> asyncio.Task[None] | None:
        """Metrics, and the settling of the reservation to the row's counts (the task doing it)."""
        m = self.metrics
        m.ledger_rows.inc()
        regular = row["prompt_tokens"] - row["cached_tokens"] - row["cache_write_tokens"]
        for cls, n in (("input", regular), ("cache_read", row["cached_tokens"]),
                       ("cache_write", row["cache_write_tokens"]), ("reasoning", row["reasoning_tokens"]),
                       ("output", row["completion_tokens"])):
            if n:
                m.tokens.labels(t.model, cls).inc(n)
        if row["cached_tokens"]:
            m.cache_hits.labels(t.model).inc()
        if ttft is not None:
            m.ttft.labels(t.model).observe(ttft)
        if t.reserved:
            used = row["prompt_tokens"] + row["completion_tokens"]
            task = asyncio.get_running_loop().create_task(
                self.limiter.settle(t.key_id, t.limits, t.reserved_tokens - used, t.hold_nanos, row["cost_nanos"])
            )
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return task
        return None


class MeteredEngine:
    """An engine whose events are counted: the ledger row is committed before ``Finish``
    passes on (so before the usage reaches the client), or queued if the request ends early.

    A request that calls the engine several times (the Responses web-search rounds) is
    ``deferred``: each round's usage adds up, and ``commit`` writes the one row once the last
    round is known (``abandon`` if the request ends first)."""

    def __init__(
        self, inner: Engine, gateway: Gateway, ticket: Ticket, request: Request | None, searches: int = 0
    ) -> None:
        self.inner = inner
        self.name = inner.name
        self._gateway = gateway
        self._ticket = ticket
        self._request = request
        self._searches = searches  # run by the server for this request, before the engine
        self.deferred = False
        self._spent = Usage()  # the rounds so far, when deferred
        self._status = "completed"
        self._first: float | None = None
        self._recorded = False
        self._settling: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.inner.start()

    async def close(self) -> None:
        await self.inner.close()

    def accepts_images(self) -> bool:
        return self.inner.accepts_images()

    def stats(self) -> dict[str, int]:
        return self.inner.stats()

    def context_length(self) -> int | None:
        return self.inner.context_length()

    def concurrency(self) -> int | None:
        return self.inner.concurrency()

    def tenant_stats(self, key_id: str) -> dict[str, int]:
        return self.inner.tenant_stats(key_id)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[EngineEvent]:
        reasoning = completion = 0
        finished = False
        status = "cancelled"
        events = self.inner.generate(request)
        try:
            async for event in events:
                if isinstance(event, Finish):
                    finished = True
                    if self.deferred:
                        self._spent += event.usage
                    else:
                        await self._record("completed", event.usage)
                    yield event
                    continue
                if self._first is None:
                    self._first = time.monotonic()
                if isinstance(event, ReasoningDelta):
                    reasoning += 1
                    completion += 1
                elif isinstance(event, ContentDelta | ToolCallDelta):
                    completion += 1
                yield event
        except Exception:
            status = "failed"
            raise
        finally:
            if not finished:
                # Cut off or failed: bill the prompt as estimated and one token per delta seen.
                # A request refused before its first event (a 400 from the engine) consumed nothing.
                prompt = 0 if self._first is None and status == "failed" else self._ticket.prompt_estimate
                partial = Usage(prompt_tokens=prompt, completion_tokens=completion, reasoning_tokens=reasoning,
                                source="server_estimate")
                if self.deferred:
                    self._spent += partial
                    self._status = status
                else:
                    self._record_later(status, partial)
            await events.aclose()  # type: ignore[attr-defined]

    async def commit(self, searches: int = 0) -> None:
        """Deferred: the request's last round has ended; ``searches`` ran during the rounds."""
        if not self._recorded:
            await self._record(self._status, self._spent, searches)

    def abandon(self, searches: int = 0) -> None:
        """Deferred: the request ended before ``commit`` (client gone, failure)."""
        if not self._recorded:
            self._record_later("cancelled" if self._status == "completed" else self._status, self._spent, searches)

    def _row(self, status: str, usage: Usage, searches: int) -> tuple[dict[str, Any], float | None]:
        t = self._ticket
        self._recorded = True
        ttft = None if self._first is None else self._first - t.started
        row = self._gateway._row(t, status, usage, self._searches + searches + usage.web_search_calls, ttft)
        self._settling = self._gateway._account(t, row, ttft)
        return row, ttft

    async def _record(self, status: str, usage: Usage, searches: int = 0) -> None:
        row, _ = self._row(status, usage, searches)
        if self._request is not None:
            setattr(self._request.state, STATE_USAGE, row)
        await self._gateway.ledger.write(row, stored_key=self._ticket.stored_key)
        if self._settling is not None:
            # The key's TPM window holds the real count before the client can send its next
            # request (a Redis round trip, run alongside the commit); a stuck Redis is not waited out.
            await asyncio.wait({self._settling}, timeout=SETTLE_WAIT)

    def _record_later(self, status: str, usage: Usage, searches: int = 0) -> None:
        row, _ = self._row(status, usage, searches)
        self._gateway.ledger.submit(row, stored_key=self._ticket.stored_key)
