"""Usage totals from the ledger, grouped by model, key, team, tag or day (the CLI, the admin
API and the console).

A row counts for the team its key belonged to when it ran. Tags are the key's as they are now,
and a request counts under each tag of its key, so the tags' totals may add up to more than
the whole; a key without tags counts under ``(untagged)``.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import String, case, func, select

from kimi_server.gate.key_record import tags_of
from kimi_server.gate.money import usd_text
from kimi_server.store.db import Database
from kimi_server.store.models import ApiKeyRow, TeamRow, UsageRow

GroupBy = Literal["model", "key", "day", "team", "tag"]
GROUPS: tuple[str, ...] = ("model", "key", "day", "team", "tag")
UNTAGGED = "(untagged)"
NO_TEAM = "(no team)"
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
_COUNTS = ("requests", *_SUMS, *_BY_SOURCE)


def _group(by: GroupBy) -> Any:
    if by in ("key", "tag"):  # tags: summed per key here, then per tag
        return UsageRow.key_id
    if by == "team":
        return UsageRow.team_id
    if by == "model":
        return UsageRow.model
    # Both SQLite and PostgreSQL spell the date of a timestamp as its first 10 characters.
    return func.substr(func.cast(UsageRow.created_at, String), 1, 10)


async def usage_totals(
    db: Database,
    *,
    key_id: str | None = None,
    since: datetime | None = None,
    by: GroupBy = "model",
    team_id: str | None = None,
) -> list[dict[str, Any]]:
    group = _group(by)
    columns = [group.label("group"), func.count().label("requests")]
    columns += [func.coalesce(func.sum(getattr(UsageRow, name)), 0).label(name) for name in _SUMS]
    columns += [
        func.coalesce(func.sum(case((UsageRow.usage_source == source, 1), else_=0)), 0).label(name)
        for name, source in _BY_SOURCE.items()
    ]
    query = select(*columns).group_by(group).order_by(group)
    if key_id is not None:
        query = query.where(UsageRow.key_id == key_id)
    if team_id is not None:
        query = query.where(UsageRow.team_id == team_id)
    if since is not None:
        query = query.where(UsageRow.created_at >= since)
    async with db.sessions() as session:
        rows = [
            {"group": row["group"], **{name: int(row[name]) for name in _COUNTS}}
            for row in (await session.execute(query)).mappings().all()
        ]
        keys = (await session.execute(select(ApiKeyRow.id, ApiKeyRow.name, ApiKeyRow.tags))).all()
        teams = {i: n for i, n in (await session.execute(select(TeamRow.id, TeamRow.name))).all()}
    if by == "tag":
        rows = _by_tag(rows, {i: tags_of(t) for i, _, t in keys})
    key_names = {i: n for i, n, _ in keys}
    out = []
    for row in rows:
        item: dict[str, Any] = {by: row["group"]}
        if by == "key":
            item["name"] = key_names.get(row["group"], "(static key)")
        elif by == "team":
            item[by] = row["group"] or NO_TEAM
            item["name"] = teams.get(row["group"], "(deleted team)") if row["group"] else NO_TEAM
        item.update({name: row[name] for name in _COUNTS})
        item["cost_usd"] = usd_text(item.pop("cost_nanos"))
        out.append(item)
    return out


def _by_tag(per_key: list[dict[str, Any]], tags: dict[str, tuple[str, ...]]) -> list[dict[str, Any]]:
    totals: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(_COUNTS, 0))
    for row in per_key:
        for tag in tags.get(row["group"]) or (UNTAGGED,):
            for name in _COUNTS:
                totals[tag][name] += row[name]
    return [{"group": tag, **totals[tag]} for tag in sorted(totals)]
