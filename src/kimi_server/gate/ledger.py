"""The usage ledger: one row per request that reached an engine, written by a single task.

Requests hand their row to the writer and (when they can still answer) wait for its commit, so
a row is durable before the response's last byte. The writer commits whatever has queued up
while the previous commit ran, in one transaction with the keys' (and teams') spend, so concurrent requests
share one fsync instead of paying one each. Where a commit needs no fsync (SQLite with
``synchronous=NORMAL``, the default) and nothing is queued, the rows of the requests that finish
in one turn of the event loop are committed together at its end, on the loop itself.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from sqlalchemy import insert, update

from kimi_server.store.db import Database
from kimi_server.store.models import ApiKeyRow, TeamRow, UsageRow

log = logging.getLogger(__name__)

MAX_BATCH = 500
BUSY_WAIT = 10.0  # seconds a commit retries a file other workers hold, before it counts as failed


@dataclass
class Spend:
    """What a batch of rows adds to the stored keys' and the teams' running totals."""

    keys: dict[str, int]
    teams: dict[str, int]


@dataclass
class _Pending:
    row: dict[str, Any]
    stored_key: bool  # spend goes on a stored key's row (static keys have none)
    done: asyncio.Future[None] | None


class Ledger:
    def __init__(self, db: Database, batch_seconds: float = 0.002) -> None:
        self.db = db
        self.batch_seconds = batch_seconds
        self._queue: asyncio.Queue[_Pending | None] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self.commits = 0
        self.rows = 0
        self._sqlite: _SqliteWriter | None = None
        self._busy = False  # a batch is being committed (an inline commit would overtake it)
        self._turn: list[_Pending] = []  # rows to commit at the end of this event-loop turn
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ledger")
        if db.is_sqlite and db.engine.url.database:
            self._sqlite = _SqliteWriter(db.engine.url.database, db.sqlite_synchronous)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="usage-ledger")

    async def close(self) -> None:
        """Writes everything queued, then stops."""
        if self._task is None:
            return
        if self._turn:
            self._commit_turn()  # rows of this very turn: committed (or queued) before the end
        self._queue.put_nowait(None)
        await self._task
        self._task = None
        if self._sqlite is not None:
            await asyncio.get_running_loop().run_in_executor(self._thread, self._sqlite.close)
        self._thread.shutdown(wait=False)

    def submit(self, row: dict[str, Any], *, stored_key: bool) -> None:
        """Queues a row without waiting (for requests whose client is gone)."""
        self._queue.put_nowait(_Pending(row, stored_key, None))

    async def write(self, row: dict[str, Any], *, stored_key: bool) -> None:
        """Queues a row and returns once it is committed."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        pending = _Pending(row, stored_key, done)
        if self._inline_writer() is not None and self._queue.empty() and not self._busy:
            # No fsync to wait for: the rows of the requests that finish in this turn of the
            # event loop are committed together at its end, on the loop, sparing the hand-over
            # to the writer task and back.
            self._turn.append(pending)
            if len(self._turn) == 1:
                asyncio.get_running_loop().call_soon(self._commit_turn)
        else:
            self._queue.put_nowait(pending)
        # Not shielded: a cancelled wait cancels only ``done`` (the writer skips a finished
        # future); the row stays queued and is written all the same. A shield costs two more
        # event-loop callbacks per request.
        await done

    def _commit_turn(self) -> None:
        batch, self._turn = self._turn, []
        writer = self._inline_writer()
        if writer is None or self._busy:
            self._hand_over(batch)
            return
        try:
            writer.commit([p.row for p in batch], _spend(batch))
        except Exception as exc:
            # Another worker's commit holding the file is routine: the writer retries it.
            if not _busy(exc):
                log.warning("ledger commit failed (inline): %s; handing the rows to the writer", type(exc).__name__)
            self._hand_over(batch)
            return
        self.commits += 1
        self.rows += len(batch)
        for p in batch:
            if p.done is not None and not p.done.done():
                p.done.set_result(None)

    def _hand_over(self, batch: list[_Pending]) -> None:
        for p in batch:
            self._queue.put_nowait(p)

    async def _run(self) -> None:
        stopping = False
        while not stopping:
            first = await self._queue.get()
            if first is None:
                break
            batch = [first]
            if self.batch_seconds and self._queue.empty():
                await asyncio.sleep(self.batch_seconds)
            while len(batch) < MAX_BATCH and not self._queue.empty():
                item = self._queue.get_nowait()
                if item is None:
                    stopping = True
                    break
                batch.append(item)
            await self._commit(batch)

    def _inline_writer(self) -> _SqliteWriter | None:
        """The SQLite writer when its commits need no fsync (so they may run on the event loop)."""
        return self._sqlite if self._sqlite is not None and self._sqlite.synchronous == "NORMAL" else None

    async def _commit(self, batch: list[_Pending]) -> None:
        self._busy = True
        try:
            await self._commit_batch(batch)
        finally:
            self._busy = False

    async def _commit_batch(self, batch: list[_Pending]) -> None:
        error = await self._commit_with_retries([p.row for p in batch], _spend(batch))
        self.commits += 1
        if error is None:
            self.rows += len(batch)
        for p in batch:
            if p.done is not None and not p.done.done():
                if error is None:
                    p.done.set_result(None)
                else:
                    p.done.set_exception(RuntimeError("the usage ledger could not be written"))
        if error is not None:
            log.error("ledger: %d rows could not be written", len(batch))

    async def _commit_with_retries(self, rows: list[dict[str, Any]], spend: Spend) -> BaseException | None:
        """Commits the rows, three tries; the last failure, or None once committed."""
        error: BaseException | None = None
        for attempt in range(3):
            try:
                await self._commit_once(rows, spend)
                return None
            except Exception as exc:
                error = exc
                log.warning("ledger commit failed (attempt %d): %s", attempt + 1, type(exc).__name__)
                await asyncio.sleep(0.05 * (attempt + 1))
        return error

    async def _commit_once(self, rows: list[dict[str, Any]], spend: Spend) -> None:
        inline = self._inline_writer()
        if inline is not None:
            # No fsync: a WAL append takes microseconds, less than a thread hop.
            await _commit_when_free(inline, rows, spend)
        elif self._sqlite is not None:
            await asyncio.get_running_loop().run_in_executor(self._thread, self._sqlite.commit, rows, spend)
        else:
            await self._commit_async(rows, spend)

    async def _commit_async(self, rows: list[dict[str, Any]], spend: Spend) -> None:
        async with self.db.sessions() as session, session.begin():
            await session.execute(insert(UsageRow), rows)
            for key_id, nanos in spend.keys.items():
                await session.execute(
                    update(ApiKeyRow).where(ApiKeyRow.id == key_id).values(spent_nanos=ApiKeyRow.spent_nanos + nanos)
                )
            for team_id, nanos in spend.teams.items():
                await session.execute(
                    update(TeamRow).where(TeamRow.id == team_id).values(spent_nanos=TeamRow.spent_nanos + nanos)
                )


def _spend(batch: list[_Pending]) -> Spend:
    """What the batch's rows add to each stored key's spend, and to each team's."""
    keys: dict[str, int] = defaultdict(int)
    teams: dict[str, int] = defaultdict(int)
    for p in batch:
        cost = p.row["cost_nanos"]
        if p.stored_key and cost:
            keys[p.row["key_id"]] += cost
            if p.row.get("team_id"):
                teams[p.row["team_id"]] += cost
    return Spend(keys, teams)


def _busy(exc: BaseException) -> bool:
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in str(exc) or "busy" in str(exc))


async def _commit_when_free(writer: _SqliteWriter, rows: list[dict[str, Any]], spend: Spend) -> None:
    """Commits on the event loop, retrying a file another worker holds with short async pauses."""
    deadline = time.monotonic() + BUSY_WAIT
    pause = 0.0002
    while True:
        try:
            writer.commit(rows, spend)
            return
        except sqlite3.OperationalError as exc:
            if not _busy(exc) or time.monotonic() > deadline:
                raise
        await asyncio.sleep(pause)
        pause = min(pause * 2, 0.01)


class _SqliteWriter:
    """SQLite commits on one thread with the stdlib driver: one thread hop per batch instead of
    one per statement (what an async driver costs), which matters most on a busy machine."""

    def __init__(self, path: str, synchronous: str) -> None:
        self.path = path
        self.synchronous = synchronous
        self._conn: sqlite3.Connection | None = None

    def commit(self, rows: list[dict[str, Any]], spend: Spend) -> None:
        if self._conn is None:
            # Committed on the event loop (NORMAL), a file another worker holds must not be
            # waited on inside SQLite's sleeping busy handler: the loop would stop. It fails at
            # once instead and ``_commit_when_free`` retries it from the loop.
            timeout = 0 if self.synchronous == "NORMAL" else 10
            self._conn = sqlite3.connect(self.path, timeout=timeout, isolation_level=None, check_same_thread=False)
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute(f"PRAGMA synchronous={self.synchronous}")
        conn = self._conn
        params = [{**row, "created_at": row["created_at"].strftime("%Y-%m-%d %H:%M:%S.%f")} for row in rows]
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.executemany(_INSERT, params)
            conn.executemany(
                "UPDATE api_keys SET spent_nanos = spent_nanos + ? WHERE id = ?",
                [(nanos, key_id) for key_id, nanos in spend.keys.items()],
            )
            if spend.teams:
                conn.executemany(
                    "UPDATE teams SET spent_nanos = spent_nanos + ? WHERE id = ?",
                    [(nanos, team_id) for team_id, nanos in spend.teams.items()],
                )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


_COLUMNS = [c.name for c in UsageRow.__table__.columns]
_INSERT = f"INSERT INTO usage ({', '.join(_COLUMNS)}) VALUES ({', '.join(':' + c for c in _COLUMNS)})"
