"""The audit trail: every administrative action (keys and teams made, changed, revoked,
rotated, deleted; console sign-ins and failed sign-ins) with who, when, from where and what
changed. An entry is written in the same transaction as the change it records, so neither
exists without the other. Secrets never reach it: what changed is taken from the public views.
"""

from __future__ import annotations

import getpass
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from kimi_server.store.db import Database, utc
from kimi_server.store.models import AuditRow

Surface = Literal["admin_api", "console", "cli"]
MAX_DETAILS_CHARS = 8000  # a change is a few fields; a longer one is cut, never refused
MAX_LISTED = 1000


@dataclass(frozen=True)
class Actor:
    """Who acts: the surface, the credential by name (never the key), and the client address."""

    surface: Surface
    who: str
    address: str | None = None


def cli_actor() -> Actor:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container)
        user = "unknown user"
    return Actor("cli", f"command line ({user[:100]})", "local")


def client_host(scope: Mapping[str, Any]) -> str | None:
    client = scope.get("client")
    return str(client[0])[:100] if client else None


def entry(actor: Actor, action: str, target: str | None, details: Mapping[str, Any], at: datetime) -> AuditRow:
    text = json.dumps(details, default=str, ensure_ascii=False, separators=(",", ":"))
    if len(text) > MAX_DETAILS_CHARS:
        text = json.dumps({"cut": text[:MAX_DETAILS_CHARS]})
    return AuditRow(
        at=at,
        surface=actor.surface,
        who=actor.who.replace("\x00", "")[:200],
        address=actor.address,
        action=action,
        target=target,
        details=text.replace("\\u0000", ""),  # PostgreSQL text holds no NUL, even escaped in JSON
    )


def note(
    session: AsyncSession, actor: Actor | None, action: str, target: str | None, details: Mapping[str, Any]
) -> None:
    """Adds the entry to the session of the change it records (committed with it)."""
    if actor is not None:
        session.add(entry(actor, action, target, details, datetime.now(UTC)))


async def record(db: Database, actor: Actor, action: str, target: str | None, details: Mapping[str, Any]) -> None:
    """An entry for an action that changes nothing else (a sign-in)."""
    async with db.sessions() as session:
        note(session, actor, action, target, details)
        await session.commit()


def as_dict(row: AuditRow) -> dict[str, Any]:
    return {
        "id": row.id,
        "at": (utc(row.at) or row.at).isoformat(),
        "surface": row.surface,
        "who": row.who,
        "address": row.address,
        "action": row.action,
        "target": row.target,
        "details": json.loads(row.details),
    }


async def entries(
    db: Database,
    *,
    since: datetime | None = None,
    action: str | None = None,
    target: str | None = None,
    limit: int = 200,
) -> list[dict[str, Any]]:
    """Newest first. ``action``: one action (``key.create``) or a family (``key``)."""
    query = select(AuditRow).order_by(AuditRow.id.desc()).limit(max(1, min(limit, MAX_LISTED)))
    if since is not None:
        query = query.where(AuditRow.at >= since)
    if action:
        query = query.where((AuditRow.action == action) | AuditRow.action.startswith(action + ".", autoescape=True))
    if target:
        query = query.where(AuditRow.target == target)
    async with db.sessions() as session:
        return [as_dict(row) for row in (await session.scalars(query)).all()]
