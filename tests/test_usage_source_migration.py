"""Revision 0002 adds the ledger's ``usage_source``: rows written before it keep every value and
read as counted by their engine (real SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, text

from kimi_server.store.db import MIGRATIONS, Database
from tests.gateway_util import postgres_database

ROW = {
    "request_id": "req_old",
    "client_request_id": None,
    "key_id": "key_a",
    "model": "kimi-k3",
    "endpoint": "chat",
    "status": "completed",
    "prompt_tokens": 12,
    "cached_tokens": 0,
    "cache_write_tokens": 0,
    "cache_ttl": "5m",
    "reasoning_tokens": 2,
    "completion_tokens": 4,
    "web_search_calls": 0,
    "cost_nanos": 7,
    "ttft_ms": 1.5,
    "duration_ms": 3.0,
    "created_at": datetime(2026, 11, 1, 10, tzinfo=UTC),
}


def at_0001(conn: Connection) -> None:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = conn
    command.upgrade(config, "0001")
    columns = ", ".join(ROW)
    conn.execute(text(f"INSERT INTO usage ({columns}) VALUES ({', '.join(':' + c for c in ROW)})"), ROW)


def upgrade_keeps_old_rows(make_db: Callable[[], Database]) -> None:
    async def run() -> None:
        db = make_db()
        async with db.engine.connect() as conn:
            await conn.run_sync(at_0001)
            await conn.commit()
        await db.migrate()
        async with db.engine.connect() as conn:
            row = (await conn.execute(text("SELECT * FROM usage"))).mappings().one()
        await db.close()
        assert row["usage_source"] == "engine"
        assert row["prompt_tokens"] == 12 and row["cost_nanos"] == 7

    asyncio.run(run())


def test_sqlite_upgrade_keeps_rows(tmp_path: Path) -> None:
    upgrade_keeps_old_rows(lambda: Database.from_settings(None, tmp_path))


@pytest.mark.integration
def test_postgres_upgrade_keeps_rows() -> None:
    with postgres_database() as url:
        upgrade_keeps_old_rows(lambda: Database.from_settings(url, Path(".")))
