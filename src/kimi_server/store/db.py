"""The database: URL from settings, an async engine, and migrations run on start.

SQLite (the default, a file under ``data_dir``) runs in WAL mode with full fsync so that a
committed ledger row survives a crash; PostgreSQL is used when ``database_url`` names one.
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, create_engine, event, text
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine

log = logging.getLogger(__name__)
MIGRATIONS = Path(__file__).parent / "migrations"
# Taken by whichever instance migrates first, so several starting together don't collide.
_PG_MIGRATION_LOCK = 0x6B696D69


def database_url(configured: str | None, data_dir: Path) -> str:
    """A SQLAlchemy async URL: the configured one with its async driver, or SQLite."""
    if not configured:
        return f"sqlite+aiosqlite:///{data_dir / 'kimi.db'}"
    for plain, driver in (
        ("postgresql://", "postgresql+asyncpg://"),
        ("postgres://", "postgresql+asyncpg://"),
        ("sqlite://", "sqlite+aiosqlite://"),
    ):
        if configured.startswith(plain):
            return driver + configured[len(plain) :]
    return configured


def utc(value: datetime | None) -> datetime | None:
    """SQLite hands back naive datetimes; everything stored is UTC."""
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=UTC)


class Database:
    def __init__(self, url: str, sqlite_synchronous: str = "FULL") -> None:
        self.url = url
        self.is_sqlite = url.startswith("sqlite")
        self.sqlite_synchronous = sqlite_synchronous.upper()
        kwargs: dict[str, Any] = {}
        if not self.is_sqlite:
            # No pre-ping (a round trip per checkout): a dropped connection fails one statement,
            # is discarded by the pool, and the ledger retries its commit.
            kwargs.update(pool_size=10, max_overflow=20)
        self.engine: AsyncEngine = create_async_engine(url, **kwargs)
        if self.is_sqlite:
            event.listen(self.engine.sync_engine, "connect", self._sqlite_pragmas)
            if self.engine.url.database and self.engine.url.database != ":memory:":
                private_sqlite_file(Path(self.engine.url.database))
        self.sessions = async_sessionmaker(self.engine, expire_on_commit=False)

    @classmethod
    def from_settings(
        cls, database_url_setting: str | None, data_dir: Path, sqlite_synchronous: str = "full"
    ) -> Database:
        if not database_url_setting:
            data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # owner-only when we make it
        return cls(database_url(database_url_setting, data_dir), sqlite_synchronous)

    async def migrate(self) -> None:
        """Brings the schema to the newest revision; every existing row is kept."""
        if self.is_sqlite and self.engine.url.database:
            # One thread hop for the whole migration instead of one per statement.
            await asyncio.to_thread(self._migrate_sqlite, self.engine.url.database)
            return
        async with self.engine.connect() as conn:
            if not self.is_sqlite:
                await conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _PG_MIGRATION_LOCK})
                await conn.commit()
            try:
                await conn.run_sync(_upgrade)
                await conn.commit()
            finally:
                if not self.is_sqlite:
                    await conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _PG_MIGRATION_LOCK})
                    await conn.commit()

    def _migrate_sqlite(self, path: str) -> None:
        engine = create_engine(f"sqlite:///{path}")
        event.listen(engine, "connect", self._sqlite_pragmas)
        try:
            with engine.connect() as conn:
                _upgrade(conn)
                conn.commit()
        finally:
            engine.dispose()

    async def close(self) -> None:
        await self.engine.dispose()

    def _sqlite_pragmas(self, dbapi_conn: Any, _: Any) -> None:
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute(f"PRAGMA synchronous={self.sqlite_synchronous}")
        cur.execute("PRAGMA busy_timeout=10000")
        cur.close()


def private_sqlite_file(path: Path) -> None:
    """The database holds key digests and every tenant's usage, so it is owner-only (0600).
    SQLite gives its -wal and -shm files the database file's mode, so creating it 0600 (an
    empty file is an empty database) covers them; an existing one readable by others is fixed."""
    if not path.parent.is_dir():
        return  # SQLite reports the missing directory itself
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        return
    except FileExistsError:
        pass
    for file in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        try:
            mode = stat.S_IMODE(file.stat().st_mode)
            if mode & 0o077:
                os.chmod(file, 0o600)
                log.warning("%s was readable by other users (mode %04o); its mode is now 0600", file, mode)
        except FileNotFoundError:
            continue
        except OSError as exc:
            log.warning("%s is readable by other users and its mode could not be changed: %s", file, exc.strerror)


def _upgrade(conn: Connection) -> None:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = conn
    command.upgrade(config, "head")
