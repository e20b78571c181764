"""Revision 0003 adds a key's default output cap: keys made before it keep every value and get
no cap of their own (the model's default applies), on real SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, text

from kimi_server.gate.keys import KeyChanges, KeyStore
from kimi_server.store.db import MIGRATIONS, Database
from tests.gateway_util import postgres_database

KEY = {
    "id": "key_0123456789abcdef",
    "name": "old",
    "digest": "d" * 64,
    "rpm": 5,
    "tpm": None,
    "budget_nanos": None,
    "spent_nanos": 0,
    "models": None,
    "created_at": datetime(2026, 11, 1, 10, tzinfo=UTC),
    "expires_at": None,
    "revoked_at": None,
}


def at_0002(conn: Connection) -> None:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = conn
    command.upgrade(config, "0002")
    columns = ", ".join(KEY)
    conn.execute(text(f"INSERT INTO api_keys ({columns}) VALUES ({', '.join(':' + c for c in KEY)})"), KEY)


def upgrade_keeps_keys(make_db: Callable[[], Database]) -> None:
    async def run() -> None:
        db = make_db()
        async with db.engine.connect() as conn:
            await conn.run_sync(at_0002)
            await conn.commit()
        await db.migrate()
        store = KeyStore(db)
        old = await store.get("old")
        assert (old.rpm, old.max_output_tokens) == (5, None)
        changed = await store.update("old", KeyChanges(max_output_tokens=1_048_576))
        assert changed.max_output_tokens == 1_048_576 and changed.as_dict()["max_output_tokens"] == 1_048_576
        cleared = await store.update("old", KeyChanges(clear=frozenset({"max_output_tokens"})))
        assert cleared.max_output_tokens is None
        await db.close()

    asyncio.run(run())


def test_sqlite_upgrade_keeps_keys(tmp_path: Path) -> None:
    upgrade_keeps_keys(lambda: Database.from_settings(None, tmp_path))


@pytest.mark.integration
def test_postgres_upgrade_keeps_keys() -> None:
    with postgres_database() as url:
        upgrade_keeps_keys(lambda: Database.from_settings(url, Path(".")))
