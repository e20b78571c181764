"""Usage totals from the ledger, grouped by model, key or day (the CLI and the admin API)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from sqlalchemy import String, case, func, select

from kimi_server.gate.keys import usd_text
from kimi_server.store.db import Database
from kimi_server.store.models import ApiKeyRow, UsageRow

GroupBy = Literal["model", "key", "day"]
_SUMS = (
    "prompt_tokens",
    "cached_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
    "completion_tokens",
    "web_search_calls",
    "cost_nanos",
)
# Requests whose engine reported no counts (see the ledger's usage_source): how much of a total
# the server counted with a tokenizer, and how much it could only estimate.
_BY_SOURCE = {"server_counted_requests": "server_count", "server_estimated_requests": "server_estimate"}


async def usage_totals(
    db: Database, *, key_id: str | None = None, since: datetime | None = None, by: GroupBy = "model"
) -> list[dict[str, Any]]:
    if by == "model":
        group: Any = UsageRow.model
    elif by == "key":
        group = UsageRow.key_id
    else:
        # Both SQLite and PostgreSQL spell the date of a timestamp as its first 10 characters.
        group = func.substr(func.cast(UsageRow.created_at, String), 1, 10)
    columns = [group.label("group"), func.count().label("requests")]
    columns += [func.coalesce(func.sum(getattr(UsageRow, name)), 0).label(name) for name in _SUMS]
    columns += [
        func.coalesce(func.sum(case((UsageRow.usage_source == source, 1), else_=0)), 0).label(name)
        for name, source in _BY_SOURCE.items()
    ]
    query = select(*columns).group_by(group).order_by(group)
    if key_id is not None:
        query = query.where(UsageRow.key_id == key_id)
    if since is not None:
        query = query.where(UsageRow.created_at >= since)
    async with db.sessions() as session:
        rows = (await session.execute(query)).mappings().all()
        names: dict[str, str] = {}
        if by == "key":
            found = await session.execute(select(ApiKeyRow.id, ApiKeyRow.name))
            names = {i: n for i, n in found.all()}
    out = []
    for row in rows:
        item: dict[str, Any] = {by: row["group"], "requests": int(row["requests"])}
        if by == "key":
            item["name"] = names.get(row["group"], "(static key)")
        for name in (*_SUMS, *_BY_SOURCE):
            item[name] = int(row[name])
        item["cost_usd"] = usd_text(item.pop("cost_nanos"))
        out.append(item)
    return out
