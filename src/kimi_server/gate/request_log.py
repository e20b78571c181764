"""The request log: the ledger's rows one by one, newest first, filtered by key, team, tag,
model, status, time, duration and failure (the admin API, the CLI and the console)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Select, select
from sqlalchemy.ext.asyncio import AsyncSession

from kimi_server.errors import InvalidRequestError
from kimi_server.gate.key_checks import check_text
from kimi_server.gate.key_record import tags_of
from kimi_server.gate.money import usd_text
from kimi_server.store.db import Database, utc
from kimi_server.store.models import ApiKeyRow, TeamRow, UsageRow

STATUSES = ("completed", "cancelled", "failed")
MAX_ROWS = 1000
STATIC_KEY = "(static key)"
_PLAIN = (
    "request_id",
    "client_request_id",
    "key_id",
    "team_id",
    "model",
    "endpoint",
    "status",
    "finish_reason",
    "error_code",
    "prompt_tokens",
    "cached_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
    "completion_tokens",
    "usage_source",
    "web_search_calls",
    "ttft_ms",
    "duration_ms",
    "end_user",
)


@dataclass(frozen=True)
class RequestFilter:
    key_id: str | None = None
    team_id: str | None = None
    tag: str | None = None
    model: str | None = None
    status: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    slow_ms: float | None = None  # only requests that took longer
    failed: bool = False
    limit: int = 100

    def check(self) -> None:
        if self.status is not None and self.status not in STATUSES:
            raise InvalidRequestError(f"'status' must be one of: {', '.join(STATUSES)}.", param="status")
        if not 1 <= self.limit <= MAX_ROWS:
            raise InvalidRequestError(f"'limit' must be between 1 and {MAX_ROWS}.", param="limit")
        if self.slow_ms is not None and not 0 <= self.slow_ms < 1e12:
            raise InvalidRequestError("'slow' must be a duration of 0 or more.", param="slow")
        for name in ("tag", "model"):
            value = getattr(self, name)
            if value is not None:
                check_text(value, name)


@dataclass(frozen=True)
class Names:
    """Key and team names and key tags, to show beside the ids."""

    keys: dict[str, str]
    tags: dict[str, tuple[str, ...]]
    teams: dict[str, str]

    @classmethod
    async def load(cls, session: AsyncSession) -> Names:
        keys = (await session.execute(select(ApiKeyRow.id, ApiKeyRow.name, ApiKeyRow.tags))).all()
        teams = (await session.execute(select(TeamRow.id, TeamRow.name))).all()
        return cls({k: n for k, n, _ in keys}, {k: tags_of(t) for k, _, t in keys}, {t: n for t, n in teams})

    def tagged(self, tag: str) -> list[str]:
        return [key_id for key_id, tags in self.tags.items() if tag in tags]


def _filtered(query: Select[UsageRow], f: RequestFilter, names: Names) -> Select[UsageRow]:
    conditions: list[Any] = []
    for column, value in ((UsageRow.key_id, f.key_id), (UsageRow.team_id, f.team_id), (UsageRow.model, f.model)):
        if value is not None:
            conditions.append(column == value)
    if f.tag is not None:
        conditions.append(UsageRow.key_id.in_(names.tagged(f.tag)))
    if f.failed:
        conditions.append(UsageRow.status == "failed")
    elif f.status is not None:
        conditions.append(UsageRow.status == f.status)
    if f.since is not None:
        conditions.append(UsageRow.created_at >= f.since)
    if f.until is not None:
        conditions.append(UsageRow.created_at < f.until)
    if f.slow_ms is not None:
        conditions.append(UsageRow.duration_ms > f.slow_ms)
    return query.where(*conditions)


def shown(row: UsageRow, names: Names) -> dict[str, Any]:
    """One row as the log shows it: the ledger's columns, with names, tags and USD."""
    item: dict[str, Any] = {name: getattr(row, name) for name in _PLAIN}
    item["created_at"] = (utc(row.created_at) or row.created_at).isoformat()
    item["key_name"] = names.keys.get(row.key_id, STATIC_KEY)
    item["team"] = names.teams.get(row.team_id) if row.team_id else None
    item["tags"] = list(names.tags.get(row.key_id, ()))
    item["cost_usd"] = usd_text(row.cost_nanos)
    return item


async def list_requests(db: Database, f: RequestFilter) -> list[dict[str, Any]]:
    f.check()
    async with db.sessions() as session:
        names = await Names.load(session)
        query = select(UsageRow).order_by(UsageRow.created_at.desc(), UsageRow.request_id.desc()).limit(f.limit)
        rows = (await session.scalars(_filtered(query, f, names))).all()
    return [shown(row, names) for row in rows]


async def one_request(db: Database, request_id: str) -> dict[str, Any] | None:
    check_text(request_id, "request_id")
    async with db.sessions() as session:
        row = await session.get(UsageRow, request_id[:64])
        if row is None:
            return None
        return shown(row, await Names.load(session))
