"""Stored API keys: create, list, show, update, revoke, and the request-time lookup.

A secret is ``sk-kimi-`` + 256 random bits, shown once; the store keeps its SHA-256 digest
(enough for a high-entropy secret: there is nothing to brute-force). Lookups are cached for at
most ``key_cache_seconds`` (< 1 s), so a revoked or expired key is refused on every instance
within a second while a busy key costs about one query a second.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from decimal import Decimal

from sqlalchemy import or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from kimi_server.errors import InvalidRequestError, NotFoundError
from kimi_server.gate.auth import digest, new_key
from kimi_server.store.db import Database, utc
from kimi_server.store.models import ApiKeyRow

NANOS = Decimal(1_000_000_000)


def usd_to_nanos(usd: Decimal) -> int:
    return int((usd * NANOS).to_integral_value())


def nanos_to_usd(nanos: int) -> Decimal:
    return (Decimal(nanos) / NANOS).normalize()


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
            "budget_usd": str(nanos_to_usd(self.budget_nanos)) if self.budget_nanos is not None else None,
            "spent_usd": str(nanos_to_usd(self.spent_nanos)),
            "models": sorted(self.models) if self.models is not None else None,
            "created_at": self.created_at.isoformat(),
            "expires_at": self.expires_at.isoformat() if self.expires_at else None,
            "revoked_at": self.revoked_at.isoformat() if self.revoked_at else None,
            "status": "revoked" if self.revoked_at else (
                "expired" if self.expires_at and self.expires_at <= datetime.now(UTC) else "active"
            ),
        }


def _record(row: ApiKeyRow) -> KeyRecord:
    return KeyRecord(
        id=row.id,
        name=row.name,
        rpm=row.rpm,
        tpm=row.tpm,
        budget_nanos=row.budget_nanos,
        spent_nanos=row.spent_nanos,
        models=frozenset(row.models.split(",")) if row.models else None,
        created_at=utc(row.created_at) or datetime.now(UTC),
        expires_at=utc(row.expires_at),
        revoked_at=utc(row.revoked_at),
    )


@dataclass(frozen=True)
class KeyChanges:
    """Fields to set on create or update; ``None`` leaves a field as it is. ``clear`` names
    limits to remove (``rpm``, ``tpm``, ``budget``, ``expires``, ``models``)."""

    rpm: int | None = None
    tpm: int | None = None
    budget_usd: Decimal | None = None
    expires_at: datetime | None = None
    models: frozenset[str] | None = None
    clear: frozenset[str] = frozenset()

    def check(self) -> None:
        for name, value in (("rpm", self.rpm), ("tpm", self.tpm)):
            if value is not None and value < 1:
                raise InvalidRequestError(f"'{name}' must be at least 1.", param=name)
        if self.budget_usd is not None and self.budget_usd < 0:
            raise InvalidRequestError("'budget' must not be negative.", param="budget")
        if self.models is not None and not all(m.strip() for m in self.models):
            raise InvalidRequestError("'models' must list model ids.", param="models")


class KeyStore:
    def __init__(self, db: Database, cache_seconds: float = 0.5) -> None:
        self.db = db
        self.cache_seconds = cache_seconds
        self._cache: dict[str, tuple[float, KeyRecord | None]] = {}
        self._inflight: dict[str, asyncio.Task[KeyRecord | None]] = {}
        self._tasks: set[asyncio.Task[KeyRecord | None]] = set()

    async def create(self, name: str, changes: KeyChanges) -> tuple[KeyRecord, str]:
        """A new key and its secret (the only time the secret exists outside the client)."""
        changes.check()
        if not name.strip() or len(name) > 200:
            raise InvalidRequestError("'name' must be 1 to 200 characters.", param="name")
        secret = new_key()
        row = ApiKeyRow(
            id="key_" + secrets.token_hex(8),
            name=name,
            digest=digest(secret),
            spent_nanos=0,
            created_at=datetime.now(UTC),
        )
        _apply(row, changes)
        async with self.db.sessions() as session:
            session.add(row)
            try:
                await session.commit()
            except IntegrityError:
                raise InvalidRequestError(f"A key named '{name}' already exists.", param="name") from None
        return _record(row), secret

    async def list(self) -> list[KeyRecord]:
        async with self.db.sessions() as session:
            rows = (await session.scalars(select(ApiKeyRow).order_by(ApiKeyRow.created_at))).all()
        return [_record(r) for r in rows]

    async def get(self, name_or_id: str) -> KeyRecord:
        async with self.db.sessions() as session:
            row = await self._find(session, name_or_id)
            return _record(row)

    async def update(self, name_or_id: str, changes: KeyChanges) -> KeyRecord:
        changes.check()
        async with self.db.sessions() as session:
            row = await self._find(session, name_or_id)
            _apply(row, changes)
            await session.commit()
            return _record(row)

    async def revoke(self, name_or_id: str) -> KeyRecord:
        async with self.db.sessions() as session:
            row = await self._find(session, name_or_id)
            if row.revoked_at is None:
                await session.execute(
                    update(ApiKeyRow).where(ApiKeyRow.id == row.id).values(revoked_at=datetime.now(UTC))
                )
                await session.commit()
                await session.refresh(row)
            return _record(row)

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
        if record is None or not record.usable(datetime.now(UTC)):
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
        record = _record(ApiKeyRow(**row._mapping)) if row is not None else None
        if len(self._cache) > 100_000:
            self._cache.clear()
        # Aged from when the query started: what it read may be that old.
        self._cache[key_digest] = (started, record)
        return record

    @staticmethod
    async def _find(session: AsyncSession, name_or_id: str) -> ApiKeyRow:
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
        row.expires_at = c.expires_at
    if c.models is not None:
        row.models = ",".join(sorted(m.strip() for m in c.models))
    cleared = {"rpm": "rpm", "tpm": "tpm", "budget": "budget_nanos", "expires": "expires_at", "models": "models"}
    for name in c.clear:
        setattr(row, cleared[name], None)


def with_spent(record: KeyRecord, spent_nanos: int) -> KeyRecord:
    return replace(record, spent_nanos=spent_nanos)
