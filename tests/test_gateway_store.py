"""Gateway store: the migrations build exactly the tables the models describe, and an upgrade
keeps rows (real SQLite)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, text

from kimi_server.gate.keys import KeyChanges, KeyStore
from kimi_server.store.db import MIGRATIONS, Database
from kimi_server.store.models import Base


def newest_revision() -> str | None:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    return ScriptDirectory.from_config(config).get_current_head()


def test_migrations_match_the_models_and_keep_rows(tmp_path: Path) -> None:
    async def first_start() -> str:
        db = Database.from_settings(None, tmp_path)
        await db.migrate()
        record, _ = await KeyStore(db).create("kept", KeyChanges(rpm=5))
        await db.close()
        return record.id

    key_id = asyncio.run(first_start())

    async def second_start() -> list[str]:
        db = Database.from_settings(None, tmp_path)
        await db.migrate()  # already at head: a no-op that must not lose anything
        names = [r.name for r in await KeyStore(db).list()]
        await db.close()
        return names

    assert asyncio.run(second_start()) == ["kept"]
    engine = create_engine(f"sqlite:///{tmp_path / 'kimi.db'}")
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
        assert diff == [], diff
        assert conn.execute(text("SELECT id FROM api_keys")).scalar() == key_id
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == newest_revision()
        assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
    engine.dispose()
