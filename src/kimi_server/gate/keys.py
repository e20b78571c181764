"""Stored API keys: create, list, show, update, revoke, rotate, and the request-time lookup.

A secret is ``sk-kimi-`` + 256 random bits, shown once; the store keeps its SHA-256 digest
(enough for a high-entropy secret: there is nothing to brute-force). Lookups are cached for at
most ``key_cache_seconds`` (< 1 s), so a revoked or expired key is refused on every instance
within a second while a busy key costs about one query a second. A rotation gives the key a new
secret and keeps the old one's digest, accepted until the grace period ends. Every change is
written with its audit entry (``audit.py``), in one transaction.
"""

from __future__ import annotations

import asyncio
import builtins
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from sqlalchemy import or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from kimi_server.errors import InvalidRequestError, NotFoundError
from kimi_server.gate import audit
from kimi_server.gate.audit import Actor
from kimi_server.gate.key_changes import KeyChanges, apply_changes, changed_fields, set_fields
from kimi_server.gate.key_checks import ModelRules, check_grace, check_name, check_soft_budget, check_text
from kimi_server.gate.key_hash import digest, new_key
from kimi_server.gate.key_record import KeyRecord, key_record
from kimi_server.gate.money import NANOS, iso, nanos_to_usd, usd_text, usd_to_nanos
from kimi_server.gate.periods import period_start, spend_since
from kimi_server.gate.team_record import load_team, models_of
from kimi_server.gate.teams import find_team
from kimi_server.store.db import Database, utc
from kimi_server.store.models import ApiKeyRow, TeamRow

__all__ = ["NANOS", "KeyChanges", "KeyRecord", "KeyStore", "nanos_to_usd", "usd_text", "usd_to_nanos"]


async def _with_spend(conn: AsyncConnection, row: ApiKeyRow, now: datetime) -> KeyRecord:
    """The key, with its team and its spend in the period holding ``now`` summed from the ledger."""
    team = await load_team(conn, row.team_id, now)
    start = period_start(row.budget_period, now)
    if start is None:
        return key_record(row, team=team)
    return key_record(row, await spend_since(conn, row.id, start), start, team)


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

    async def create(self, name: str, changes: KeyChanges, actor: Actor | None = None) -> tuple[KeyRecord, str]:
        """A new key and its secret (the only time the secret exists outside the client)."""
        check_name(name)
        changes.check(self.rules)
        secret = new_key()
        row = ApiKeyRow(
            id="key_" + secrets.token_hex(8),
            name=name,
            digest=digest(secret),
            spent_nanos=0,
            capture=False,
            created_at=datetime.now(UTC),
        )
        async with self.db.sessions() as session:
            apply_changes(row, changes, await self._team_id(session, changes))
            models = await _usable_models(session, row)
            self.rules.check_spend(row.budget_nanos, models, allowed=changes.allow_unpriced_budget)
            check_soft_budget(row.soft_budget_nanos, row.budget_nanos)
            session.add(row)
            try:
                await session.flush()
            except IntegrityError:
                raise InvalidRequestError(f"A key named '{name}' already exists.", param="name") from None
            record = await _with_spend(await session.connection(), row, self.clock())
            audit.note(session, actor, "key.create", row.id, set_fields(record.as_dict()))
            await session.commit()
        return record, secret

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

    async def update(self, name_or_id: str, changes: KeyChanges, actor: Actor | None = None) -> KeyRecord:
        changes.check(self.rules)
        async with self.db.sessions() as session:
            row = await self._find(session, name_or_id)
            conn = await session.connection()
            before = (await _with_spend(conn, row, self.clock())).as_dict()
            apply_changes(row, changes, await self._team_id(session, changes))
            if changes.touches_spend():
                models = await _usable_models(session, row)
                self.rules.check_spend(row.budget_nanos, models, allowed=changes.allow_unpriced_budget)
            check_soft_budget(row.soft_budget_nanos, row.budget_nanos)
            await session.flush()
            record = await _with_spend(conn, row, self.clock())
            audit.note(session, actor, "key.update", row.id, changed_fields(before, record.as_dict()))
            await session.commit()
            return record

    async def revoke(self, name_or_id: str, actor: Actor | None = None) -> KeyRecord:
        async with self.db.sessions() as session:
            row = await self._find(session, name_or_id)
            if row.revoked_at is None:
                row.revoked_at = datetime.now(UTC)
                row.previous_digest = row.previous_expires_at = None  # no secret of it is accepted
                audit.note(session, actor, "key.revoke", row.id, {"name": row.name})
                await session.commit()
                await session.refresh(row)
            return await _with_spend(await session.connection(), row, self.clock())

    async def rotate(self, name_or_id: str, grace_seconds: int, actor: Actor | None = None) -> tuple[KeyRecord, str]:
        """A new secret for the key (same id, limits, team and history); the old one is
        accepted for ``grace_seconds`` more, then refused. Rotating again ends an earlier
        secret's grace at once."""
        check_grace(grace_seconds)
        secret = new_key()
        async with self.db.sessions() as session:
            row = await self._find(session, name_or_id)
            if row.revoked_at is not None:
                raise InvalidRequestError("A revoked key cannot be rotated: create a new one.", param="key")
            now = self.clock()
            row.previous_digest = row.digest if grace_seconds else None
            row.previous_expires_at = now + timedelta(seconds=grace_seconds) if grace_seconds else None
            row.digest = digest(secret)
            details = {"grace_seconds": grace_seconds, "previous_secret_expires_at": iso(row.previous_expires_at)}
            audit.note(session, actor, "key.rotate", row.id, details)
            await session.commit()
            return await _with_spend(await session.connection(), row, self.clock()), secret

    async def lookup(self, secret: str) -> KeyRecord | None:
        """The usable key with this secret, or None (unknown, revoked or expired; a replaced
        secret past its grace).

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
            found = (
                await conn.execute(
                    select(ApiKeyRow).where(
                        or_(ApiKeyRow.digest == key_digest, ApiKeyRow.previous_digest == key_digest)
                    )
                )
            ).first()
            record = None
            if found is not None:
                row = ApiKeyRow(**found._mapping)
                record = await _with_spend(conn, row, self.clock())
                if row.digest != key_digest:
                    record = _replaced_secret(record, utc(row.previous_expires_at))
        if len(self._cache) > 100_000:
            self._cache.clear()
        # Aged from when the query started: what it read may be that old.
        self._cache[key_digest] = (started, record)
        return record

    async def _team_id(self, session: AsyncSession, changes: KeyChanges) -> str | None:
        if changes.team is None or "team" in changes.clear:
            return None
        return (await find_team(session, changes.team, param="team")).id

    @staticmethod
    async def _find(session: AsyncSession, name_or_id: str) -> ApiKeyRow:
        check_text(name_or_id, "key")
        row = await session.scalar(
            select(ApiKeyRow).where(or_(ApiKeyRow.id == name_or_id, ApiKeyRow.name == name_or_id))
        )
        if row is None:
            raise NotFoundError(f"No API key named or with id '{name_or_id}'.", param="key", code="key_not_found")
        return row


async def _usable_models(session: AsyncSession, row: ApiKeyRow) -> frozenset[str] | None:
    """The models the key may use: its own, within its team's (None: every model)."""
    own = models_of(row.models)
    team = await session.get(TeamRow, row.team_id) if row.team_id else None
    theirs = models_of(team.models) if team is not None else None
    if own is None or theirs is None:
        return own if theirs is None else theirs
    return own & theirs


def _replaced_secret(record: KeyRecord, until: datetime | None) -> KeyRecord:
    """The key as its replaced secret may use it: only until the grace period ends."""
    if until is None:
        return replace(record, revoked_at=record.revoked_at or record.created_at)  # never usable
    ends = until if record.expires_at is None else min(until, record.expires_at)
    return replace(record, expires_at=ends)
