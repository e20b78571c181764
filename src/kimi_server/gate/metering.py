"""The end of a request: its ledger row, the metrics, the settling of its reservation, and the
soft-budget check, whether it finished, failed or was cut off.

``MeteredEngine`` wraps the engine a request calls and hands what it counted to the ``Meter``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Callable, Coroutine
from dataclasses import replace
from datetime import datetime
from typing import Any

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
from kimi_server.errors import APIError
from kimi_server.gate.budget_alerts import BudgetAlerts
from kimi_server.gate.ledger import Ledger
from kimi_server.gate.limits import InstantLimiter, Limiter, Limits, LocalLimiter
from kimi_server.gate.metrics import Metrics
from kimi_server.gate.periods import period_start, period_tag
from kimi_server.gate.prices import Billable, PriceBook
from kimi_server.gate.request_record import RequestRecord
from kimi_server.gate.reservation import Reservation
from kimi_server.gate.shared_limits import MappedLimiter

SETTLE_WAIT = 0.5  # seconds a response waits at most for its limits to settle
Ending = tuple[str | None, str | None]  # a request's finish reason and error code, for its row


def _settling_limits(limits: Limits, budget_period: str | None, row: dict[str, Any]) -> Limits:
    """The cost counts in the period the row is dated in, which is a new one when the request
    ran past the end of the period it was admitted in."""
    tag = period_tag(budget_period, period_start(budget_period, row["created_at"]))
    return limits if tag == limits.period else replace(limits, period=tag, spent_nanos=0)


def error_code(exc: BaseException) -> str:
    """A failure as the request log names it: the API error's own code, else a generic one."""
    code = exc.code if isinstance(exc, APIError) else None
    return (code or "internal_error")[:64]


class Meter:
    def __init__(
        self,
        prices: PriceBook,
        metrics: Metrics,
        ledger: Ledger,
        limiter: Limiter,
        alerts: BudgetAlerts,
        clock: Callable[[], datetime],
    ) -> None:
        self.prices = prices
        self.metrics = metrics
        self.ledger = ledger
        self.limiter = limiter  # replaced by the gateway when it changes (workers share a file)
        self.alerts = alerts
        self.clock = clock
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def limiter(self) -> Limiter:
        return self._limiter

    @limiter.setter
    def limiter(self, limiter: Limiter) -> None:
        self._limiter = limiter
        self._instant: InstantLimiter | None = limiter if isinstance(limiter, LocalLimiter | MappedLimiter) else None

    def spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Runs ``work`` off the request; ``close`` waits for it."""
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def close(self) -> None:
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def row(
        self,
        t: Reservation,
        status: str,
        usage: Usage,
        searches: int,
        ttft: float | None,
        ending: Ending = (None, None),
    ) -> dict[str, Any]:
        """The request's ledger row; ``ending``: its finish reason and error code."""
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
            "created_at": self.clock(),
            "end_user": t.end_user,
            "finish_reason": ending[0],
            "error_code": ending[1],
            "team_id": t.team_id,
        }

    def account(self, t: Reservation, row: dict[str, Any], ttft: float | None) -> asyncio.Task[None] | None:
        """Metrics, and the settling of the reservation to the row's counts (the task doing it)."""
        self._observe(t, row, ttft)
        return self._settle(t, row)

    def _observe(self, t: Reservation, row: dict[str, Any], ttft: float | None) -> None:
        m = self.metrics
        m.ledger_rows.inc()
        regular = row["prompt_tokens"] - row["cached_tokens"] - row["cache_write_tokens"]
        for cls, n in (
            ("input", regular),
            ("cache_read", row["cached_tokens"]),
            ("cache_write", row["cache_write_tokens"]),
            ("reasoning", row["reasoning_tokens"]),
            ("output", row["completion_tokens"]),
        ):
            if n:
                m.child(m.tokens, t.model, cls).inc(n)
        if row["cached_tokens"]:
            m.child(m.cache_hits, t.model).inc()
        if row["cost_nanos"]:
            m.child(m.spend, t.model).inc(row["cost_nanos"] / 1e9)
        if ttft is not None:
            m.child(m.ttft, t.model).observe(ttft)

    def _settle(self, t: Reservation, row: dict[str, Any]) -> asyncio.Task[None] | None:
        """Settles the key's (and its team's) reservation to the row's counts."""
        used = row["prompt_tokens"] + row["completion_tokens"]
        settling = []
        if t.reserved:
            settling.append((t.key_id, _settling_limits(t.limits, t.budget_period, row)))
        if t.team_reserved and t.team_id is not None and t.team_limits is not None:
            settling.append((t.team_id, _settling_limits(t.team_limits, t.team_budget_period, row)))
        if not settling:
            return None
        refund, hold, cost = t.reserved_tokens - used, t.hold_nanos, row["cost_nanos"]
        if self._instant is not None:
            for holder, limits in settling:  # no I/O: settled before the response goes on
                self._instant.settle_now(holder, limits, refund, hold, cost)
            return None
        return self.spawn(self._settle_all(settling, refund, hold, cost))

    async def _settle_all(self, settling: list[tuple[str, Limits]], refund: int, hold: int, cost: int) -> None:
        await asyncio.gather(*(self.limiter.settle(holder, limits, refund, hold, cost) for holder, limits in settling))

    async def write(self, t: Reservation, row: dict[str, Any]) -> None:
        """Commits the row; then, off the request, the soft-budget check."""
        await self.ledger.write(row, stored_key=t.stored_key)
        if self.alerts.worth_checking(t, row):
            self.spawn(self.alerts.check(t, row))

    def submit(self, t: Reservation, row: dict[str, Any]) -> None:
        """Queues the row without waiting (the client is gone)."""
        if self.alerts.worth_checking(t, row):
            self.spawn(self._write_then_check(t, row))
        else:
            self.ledger.submit(row, stored_key=t.stored_key)

    async def _write_then_check(self, t: Reservation, row: dict[str, Any]) -> None:
        await self.ledger.write(row, stored_key=t.stored_key)
        await self.alerts.check(t, row)


class MeteredEngine:
    """An engine whose events are counted: the ledger row is committed before ``Finish``
    passes on (so before the usage reaches the client), or queued if the request ends early.

    A request that calls the engine several times (the Responses web-search rounds) is
    ``deferred``: each round's usage adds up, and ``commit`` writes the one row once the last
    round is known (``abandon`` if the request ends first)."""

    def __init__(
        self, inner: Engine, meter: Meter, ticket: Reservation, record: RequestRecord | None, searches: int = 0
    ) -> None:
        self.inner = inner
        self.name = inner.name
        self._meter = meter
        self._ticket = ticket
        self._request_record = record  # its log line shows the row
        self._searches = searches  # run by the server for this request, before the engine
        self.deferred = False
        self._spent = Usage()  # the rounds so far, when deferred
        self._status = "completed"
        self._ending: Ending = (None, None)  # the last round's finish reason, or the error's code
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

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[EngineEvent, None]:
        reasoning = completion = 0
        finished = False
        status = "cancelled"
        events = self.inner.generate(request)
        try:
            async for event in events:
                if isinstance(event, Finish):
                    finished = True
                    self._ending = (event.reason, None)
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
        except Exception as exc:
            status = "failed"
            self._ending = (None, error_code(exc))
            raise
        finally:
            if not finished:
                self._ended_early(status, completion, reasoning)
            await events.aclose()

    def _ended_early(self, status: str, completion: int, reasoning: int) -> None:
        """Cut off or failed: bill the prompt as estimated and one token per delta seen. A
        request refused before its first event (a 400 from the engine) consumed nothing."""
        if status == "cancelled":
            self._ending = (None, None)  # an earlier round's finish is not how it ended
        prompt = 0 if self._first is None and status == "failed" else self._ticket.prompt_estimate
        partial = Usage(
            prompt_tokens=prompt,
            completion_tokens=completion,
            reasoning_tokens=reasoning,
            source="server_estimate",
        )
        if self.deferred:
            self._spent += partial
            self._status = status
        else:
            self._record_later(status, partial)

    async def commit(self, searches: int = 0) -> None:
        """Deferred: the request's last round has ended; ``searches`` ran during the rounds."""
        if not self._recorded:
            await self._record(self._status, self._spent, searches)

    def abandon(self, searches: int = 0) -> None:
        """Deferred: the request ended before ``commit`` (client gone, failure)."""
        if not self._recorded:
            self._record_later("cancelled" if self._status == "completed" else self._status, self._spent, searches)

    def _row(self, status: str, usage: Usage, searches: int) -> dict[str, Any]:
        t = self._ticket
        self._recorded = True
        ttft = None if self._first is None else self._first - t.started
        row = self._meter.row(t, status, usage, self._searches + searches + usage.web_search_calls, ttft, self._ending)
        self._settling = self._meter.account(t, row, ttft)
        return row

    async def _record(self, status: str, usage: Usage, searches: int = 0) -> None:
        row = self._row(status, usage, searches)
        if self._request_record is not None:
            self._request_record.usage = row
        await self._meter.write(self._ticket, row)
        if self._settling is not None:
            # The key's TPM window holds the real count before the client can send its next
            # request (a Redis round trip, run alongside the commit); a stuck Redis is not waited out.
            await asyncio.wait({self._settling}, timeout=SETTLE_WAIT)

    def _record_later(self, status: str, usage: Usage, searches: int = 0) -> None:
        self._meter.submit(self._ticket, self._row(status, usage, searches))
