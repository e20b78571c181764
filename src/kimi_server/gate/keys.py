"""Stored API keys: create, list, show, update, revoke, and the request-time lookup.

A secret is ``sk-kimi-`` + 256 random bits, shown once; the store keeps its SHA-256 digest
(enough for a high-entropy secret: there is nothing to brute-force). Lookups are cached for at
most ``key_cache_seconds`` (< 1 s), so a revoked or expired key is refused on every instance
within a second while a busy key costs about one query a second.
"""

from __future__ import annotations

import asyncio
import builtins
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from decimal import Decimal

from sqlalchemy import or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from kimi_server.errors import InvalidRequestError, NotFoundError
from kimi_server.gate.key_checks import (
    ModelRules,
    check_budget,
    check_count,
    check_expiry,
    check_name,
    check_period,
    check_soft_budget,
    check_text,
)
from kimi_server.gate.key_hash import digest, new_key
from kimi_server.gate.periods import NONE, period_end, period_start, spend_since
from kimi_server.policy.output_caps import check_output_cap
from kimi_server.store.db import Database, utc
from kimi_server.store.models import ApiKeyRow

NANOS = Decimal(1_000_000_000)


def usd_to_nanos(usd: Decimal) -> int:
    return int((usd * NANOS).to_integral_value())


def nanos_to_usd(nanos: int) -> Decimal:
    return (Decimal(nanos) / NANOS).normalize()


def usd_text(nanos: int) -> str:
    """An amount as people write it: "10", "0.000000001" (never "1E+1" or "1E-9")."""
    return format(nanos_to_usd(nanos), "f")


@dataclass(frozen=True)
class KeyRecord:
    id: str
    name: str
    rpm: int | None
    tpm: int | None
    budget_nanos: int | None
    spent_nanos: int
    models: frozenset[str] | None
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    max_output_tokens: int | None = None  # for requests that name no cap; None: the model's
    budget_period: str | None = None  # daily | weekly | monthly; None: the budget is for life
    soft_budget_nanos: int | None = None
    # The period the figure below belongs to (None: lifetime), and the ledger's spend in it.
    period_start: datetime | None = None
    period_spent_nanos: int = 0

    @property
    def budget_spent_nanos(self) -> int:
        """What counts against the budget: the period's spend, or all of it."""
        return self.period_spent_nanos if self.budget_period is not None else self.spent_nanos

    def usable(self, at: datetime) -> bool:
        return self.revoked_at is None and (self.expires_at is None or self.expires_at > at)

    def as_dict(self) -> dict[str, object]:
        """The public view (admin API, CLI): never the secret, never its digest."""
        return {
            "id": self.id,
            "object": "api_key",
            "name": self.name,
            "rpm": self.rpm,
            "tpm": self.tpm,
            "budget_usd": usd_text(self.budget_nanos) if self.budget_nanos is not None else None,
            "spent_usd": usd_text(self.spent_nanos),
            "budget_period": self.budget_period or NONE,
            "period_start": self.period_start.isoformat() if self.period_start else None,
            "period_resets_at": _iso(period_end(self.budget_period, self.period_start)),
            "period_spent_usd": usd_text(self.budget_spent_nanos),
            "soft_budget_usd": usd_text(self.soft_budget_nanos) if self.soft_budget_nanos is not None else None,
            "models": sorted(self.models) if self.models is not None else None,
            "max_output_tokens": self.max_output_tokens,
            "created_at": self.created_at.isoformat(),
            "expires_at": self.expires_at.isoformat() if self.expires_at else None,
            "revoked_at": self.revoked_at.isoformat() if self.revoked_at else None,
            "status": "revoked"
            if self.revoked_at
            else ("expired" if self.expires_at and self.expires_at <= datetime.now(UTC) else "active"),
        }


def _iso(at: datetime | None) -> str | None:
    return at.isoformat() if at is not None else None


def _record(row: ApiKeyRow, period_spent_nanos: int = 0, start: datetime | None = None) -> KeyRecord:
    return KeyRecord(
        id=row.id,
        name=row.name,
        rpm=row.rpm,
        tpm=row.tpm,
        budget_nanos=row.budget_nanos,
        spent_nanos=row.spent_nanos,
        models=_models_of(row),
        created_at=utc(row.created_at) or datetime.now(UTC),
        expires_at=utc(row.expires_at),
        revoked_at=utc(row.revoked_at),
        max_output_tokens=row.max_output_tokens,
        budget_period=row.budget_period,
        soft_budget_nanos=row.soft_budget_nanos,
        period_start=start,
        period_spent_nanos=period_spent_nanos,
    )


async def _with_spend(conn: AsyncConnection, row: ApiKeyRow, now: datetime) -> KeyRecord:
    """The key, with its spend in the period holding ``now`` summed from the ledger."""
    start = period_start(row.budget_period, now)
    if start is None:
        return _record(row)
    return _record(row, await spend_since(conn, row.id, start), start)


def _models_of(row: ApiKeyRow) -> frozenset[str] | None:
    return frozenset(row.models.split(",")) if row.models else None


@dataclass(frozen=True)
class KeyChanges:
    """Fields to set on create or update; ``None`` leaves a field as it is. ``clear`` names
    limits to remove (``rpm``, ``tpm``, ``budget``, ``expires``, ``models``,
    ``max_output_tokens``, ``soft_budget``)."""

    rpm: int | None = None
    tpm: int | None = None
    budget_usd: Decimal | None = None
    expires_at: datetime | None = None
    models: frozenset[str] | None = None
    max_output_tokens: int | None = None
    budget_period: str | None = None  # daily | weekly | monthly | none
    soft_budget_usd: Decimal | None = None
    clear: frozenset[str] = frozenset()
    # A budget on models without a price never bites; set only when the operator means it.
    allow_unpriced_budget: bool = False

    def check(self, rules: ModelRules) -> None:
        check_count(self.rpm, "rpm")
        check_count(self.tpm, "tpm")
        check_output_cap(self.max_output_tokens)
        check_budget(self.budget_usd)
        check_budget(self.soft_budget_usd, "soft_budget_usd")
        check_period(self.budget_period)
        check_expiry(self.expires_at, datetime.now(UTC))
        rules.check_models(self.models)

    def touches_spend(self) -> bool:
        return self.budget_usd is not None or self.models is not None or bool({"budget", "models"} & self.clear)


class KeyStore:
    def __init__(
        self,
        db: Database,
        cache_seconds: float = 0.5,
        rules: ModelRules | None = None,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.db = db
        self.clock = clock or (lambda: datetime.now(UTC))  # periods and expiry are read against it
        self.rules = rules or ModelRules.catalogue_only()
        self.cache_seconds = cache_seconds
        self._cache: dict[str, tuple[float, KeyRecord | None]] = {}
        self._inflight: dict[str, asyncio.Task[KeyRecord | None]] = {}
        self._tasks: set[asyncio.Task[KeyRecord | None]] = set()

    async def create(self, name: str, changes: KeyChanges) -> tuple[KeyRecord, str]:
        """A new key and its secret (the only time the secret exists outside the client)."""
        check_name(name)
        changes.check(self.rules)
        secret = new_key()
        row = ApiKeyRow(
            id="key_" + secrets.token_hex(8),
            name=name,
            digest=digest(secret),
            spent_nanos=0,
            created_at=datetime.now(UTC),
        )
        _apply(row, changes)
        self.rules.check_spend(row.budget_nanos, _models_of(row), allowed=changes.allow_unpriced_budget)
        check_soft_budget(row.soft_budget_nanos, row.budget_nanos)
        async with self.db.sessions() as session:
            session.add(row)
            try:
                await session.commit()
            except IntegrityError:
                raise InvalidRequestError(f"A key named '{name}' already exists.", param="name") from None
        return _record(row, 0, period_start(row.budget_period, self.clock())), secret

    async def list(self) -> list[KeyRecord]:
        async with self.db.sessions() as session:
            rows = (await session.scalars(select(ApiKeyRow).order_by(ApiKeyRow.created_at))).all()
            conn = await session.connection()
            now = self.clock()
            return [await _with_spend(conn, r, now) for r in rows]

    async def unpriced_budgets(self) -> Sequence[tuple[KeyRecord, Sequence[str]]]:
        """Usable keys with a budget, and the models they may use that have no price."""
        now = datetime.now(UTC)
        found: builtins.list[tuple[KeyRecord, Sequence[str]]] = []
        for record in await self.list():
            unpriced = self.rules.unpriced(record.models)
            if record.budget_nanos is not None and unpriced and record.usable(now):
                found.append((record, unpriced))
        return found

    async def get(self, name_or_id: str) -> KeyRecord:
        async with self.db.sessions() as session:
            row = await self._find(session, name_or_id)
            return await _with_spend(await session.connection(), row, self.clock())

    async def update(self, name_or_id: str, changes: KeyChanges) -> KeyRecord:
        changes.check(self.rules)
        async with self.db.sessions() as session:
            row = await self._find(session, name_or_id)
            _apply(row, changes)
            if changes.touches_spend():
                self.rules.check_spend(row.budget_nanos, _models_of(row), allowed=changes.allow_unpriced_budget)
            check_soft_budget(row.soft_budget_nanos, row.budget_nanos)
            await session.commit()
            return await _with_spend(await session.connection(), row, self.clock())

    async def revoke(self, name_or_id: str) -> KeyRecord:
        async with self.db.sessions() as session:
            row = await self._find(session, name_or_id)
            if row.revoked_at is None:
                await session.execute(
                    update(ApiKeyRow).where(ApiKeyRow.id == row.id).values(revoked_at=datetime.now(UTC))
                )
                await session.commit()
                await session.refresh(row)
            return await _with_spend(await session.connection(), row, self.clock())

    async def lookup(self, secret: str) -> KeyRecord | None:
        """The usable key with this secret, or None (unknown, revoked or expired).

        An entry younger than half the cache time is used as is; an older one is used while one
        background query refreshes it; past the cache time, callers wait for that one query.
        So a busy key never waits on the database, and concurrent misses share one query.
        """
        key_digest = digest(secret)
        now = time.monotonic()
        hit = self._cache.get(key_digest)
        age = now - hit[0] if hit is not None else None
        if hit is None or age is None or age >= self.cache_seconds:
            record = await self._refresh(key_digest)
        else:
            record = hit[1]
            if age >= self.cache_seconds / 2 and key_digest not in self._inflight:
                task = asyncio.get_running_loop().create_task(self._refresh(key_digest))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        if record is None or not record.usable(self.clock()):
            return None
        return record

    async def _refresh(self, key_digest: str) -> KeyRecord | None:
        pending = self._inflight.get(key_digest)
        if pending is None:
            pending = asyncio.get_running_loop().create_task(self._query(key_digest))
            self._inflight[key_digest] = pending
            pending.add_done_callback(lambda _: self._inflight.pop(key_digest, None))
        return await asyncio.shield(pending)

    async def _query(self, key_digest: str) -> KeyRecord | None:
        started = time.monotonic()
        async with self.db.engine.connect() as conn:
            row = (await conn.execute(select(ApiKeyRow).where(ApiKeyRow.digest == key_digest))).first()
            record = await _with_spend(conn, ApiKeyRow(**row._mapping), self.clock()) if row is not None else None
        if len(self._cache) > 100_000:
            self._cache.clear()
        # Aged from when the query started: what it read may be that old.
        self._cache[key_digest] = (started, record)
        return record

    @staticmethod
    async def _find(session: AsyncSession, name_or_id: str) -> ApiKeyRow:
        check_text(name_or_id, "key")
        row = await session.scalar(
            select(ApiKeyRow).where(or_(ApiKeyRow.id == name_or_id, ApiKeyRow.name == name_or_id))
        )
        if row is None:
            raise NotFoundError(f"No API key named or with id '{name_or_id}'.", param="key", code="key_not_found")
        return row


def _apply(row: ApiKeyRow, c: KeyChanges) -> None:
    if c.rpm is not None:
        row.rpm = c.rpm
    if c.tpm is not None:
        row.tpm = c.tpm
    if c.budget_usd is not None:
        row.budget_nanos = usd_to_nanos(c.budget_usd)
    if c.expires_at is not None:
        row.expires_at = c.expires_at.astimezone(UTC)  # SQLite keeps no offset: store UTC
    if c.models is not None:
        row.models = ",".join(sorted(c.models))  # checked: known ids, none holds a comma
    if c.max_output_tokens is not None:
        row.max_output_tokens = c.max_output_tokens
    if c.budget_period is not None:
        row.budget_period = None if c.budget_period == NONE else c.budget_period
    if c.soft_budget_usd is not None:
        row.soft_budget_nanos = usd_to_nanos(c.soft_budget_usd)
    cleared = {
        "rpm": "rpm",
        "tpm": "tpm",
        "budget": "budget_nanos",
        "expires": "expires_at",
        "models": "models",
        "max_output_tokens": "max_output_tokens",
        "soft_budget": "soft_budget_nanos",
    }
    for name in c.clear:
        setattr(row, cleared[name], None)


def with_spent(record: KeyRecord, spent_nanos: int) -> KeyRecord:
    return replace(record, spent_nanos=spent_nanos)
