"""Revisions 0006-0008 (the request log's columns, captures, the audit trail, teams, tags and
rotation) keep every key and ledger row written before them, which read as no team, no tags, no
capture and no finish reason; and they come off again (real SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, text

from kimi_server.gate.keys import KeyStore
from kimi_server.gate.usage import usage_totals
from kimi_server.store.db import MIGRATIONS, Database
from tests.gateway_util import postgres_database

NOW = datetime(2026, 11, 1, 10, tzinfo=UTC)
KEY = {"id": "key_00000000000000aa", "name": "old", "digest": "d" * 64, "spent_nanos": 7, "created_at": NOW}
ROW = {
    "request_id": "req_old",
    "key_id": KEY["id"],
    "model": "kimi-k3",
    "endpoint": "chat",
    "status": "completed",
    "prompt_tokens": 12,
    "cached_tokens": 0,
    "cache_write_tokens": 0,
    "cache_ttl": "5m",
    "reasoning_tokens": 2,
    "completion_tokens": 4,
    "usage_source": "engine",
    "web_search_calls": 0,
    "cost_nanos": 7,
    "duration_ms": 3.0,
    "created_at": NOW,
}


def _config(conn: Connection) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = conn
    return config


def at_0005(conn: Connection) -> None:
    command.upgrade(_config(conn), "0005")
    for table, row in (("api_keys", KEY), ("usage", ROW)):
        conn.execute(text(f"INSERT INTO {table} ({', '.join(row)}) VALUES ({', '.join(':' + c for c in row)})"), row)


def down_to_0005(conn: Connection) -> None:
    command.downgrade(_config(conn), "0005")


def upgrade_keeps_rows(make_db: Callable[[], Database]) -> None:
    async def run() -> None:
        db = make_db()
        async with db.engine.connect() as conn:
            await conn.run_sync(at_0005)
            await conn.commit()
        await db.migrate()
        record = await KeyStore(db).get("old")
        assert (record.team, record.tags, record.capture, record.spent_nanos) == (None, (), False, 7)
        (by_team,) = await usage_totals(db, by="team")
        assert (by_team["team"], by_team["requests"]) == ("(no team)", 1)
        async with db.engine.connect() as conn:
            row = (await conn.execute(text("SELECT * FROM usage"))).mappings().one()
            assert (row["finish_reason"], row["error_code"], row["team_id"], row["prompt_tokens"]) == (
                None,
                None,
                None,
                12,
            )
            await conn.run_sync(down_to_0005)
            await conn.commit()
            kept = (await conn.execute(text("SELECT count(*) FROM usage"))).scalar()
        await db.close()
        assert kept == 1

    asyncio.run(run())


def test_sqlite_upgrade_keeps_rows(tmp_path: Path) -> None:
    upgrade_keeps_rows(lambda: Database.from_settings(None, tmp_path))


@pytest.mark.integration
def test_postgres_upgrade_keeps_rows() -> None:
    with postgres_database() as url:
        upgrade_keeps_rows(lambda: Database.from_settings(url, Path("unused")))
