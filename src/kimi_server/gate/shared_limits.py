"""The limits of ``limits.py`` shared by the worker processes of one server (``serve --workers``)
through a SQLite file, for when no Redis is configured.

Each call is one short write transaction: read the key's buckets, run ``LocalLimiter``'s own
arithmetic on them, write them back; so a check and its reservation are one atomic step across
the workers, and the figures are those one process would have. Times are wall-clock seconds
(the workers share the machine's clock). A busy file is retried from the event loop rather than
waited on inside SQLite, so a worker never blocks while another holds the lock; past
``LOCK_WAIT`` (or if the file fails) the call falls back to this worker's own limiter and says
so in the log.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from kimi_server.gate.limits import Decision, Limits, LocalLimiter, Snapshot, _Bucket, _KeyState

log = logging.getLogger(__name__)
T = TypeVar("T")
LOCK_WAIT = 2.0  # seconds a call retries a busy file before falling back to this worker's figures

_SCHEMA = """CREATE TABLE IF NOT EXISTS buckets (
    key_id TEXT PRIMARY KEY, requests REAL, requests_at REAL, tokens REAL, tokens_at REAL,
    spent INTEGER, held INTEGER, period INTEGER)"""


class SqliteLimiter:
    def __init__(self, path: Path) -> None:
        # isolation_level=None: transactions are begun and ended here, explicitly. Setting up
        # waits for the other workers doing the same; after that, no busy timeout: a locked file
        # is retried by _apply, off SQLite's sleeping busy handler.
        self._conn = sqlite3.connect(path, timeout=LOCK_WAIT * 5, isolation_level=None, check_same_thread=False)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=OFF")  # live counters, rebuilt on every start
        self._conn.execute(_SCHEMA)
        self._conn.execute("PRAGMA busy_timeout=0")
        self._work = LocalLimiter(clock=time.time)  # the arithmetic, on one key loaded at a time
        self._fallback = LocalLimiter()
        self._warned = False

    def _transaction(self, key_id: str, op: Callable[[LocalLimiter], T]) -> T:
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            row = conn.execute(
                "SELECT requests, requests_at, tokens, tokens_at, spent, held, period FROM buckets WHERE key_id = ?",
                (key_id,),
            ).fetchone()
            keys = self._work._keys
            keys.clear()
            if row is not None:
                keys[key_id] = _KeyState(_Bucket(row[0], row[1]), _Bucket(row[2], row[3]), row[4], row[5], row[6])
            result = op(self._work)
            s = keys[key_id]
            conn.execute(
                "INSERT OR REPLACE INTO buckets VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (key_id, s.requests.level, s.requests.at, s.tokens.level, s.tokens.at, s.spent, s.held, s.period),
            )
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return result

    async def _apply(self, key_id: str, op: Callable[[LocalLimiter], T]) -> T:
        deadline = time.monotonic() + LOCK_WAIT
        pause = 0.0002
        while True:
            try:
                return self._transaction(key_id, op)
            except sqlite3.Error as exc:
                busy = isinstance(exc, sqlite3.OperationalError) and ("locked" in str(exc) or "busy" in str(exc))
                if not busy or time.monotonic() > deadline:
                    # Like an unreachable Redis: requests go on, limited by this worker alone.
                    if not self._warned:
                        log.warning(
                            "shared limits file unusable (%s): this worker counts alone for now", type(exc).__name__
                        )
                        self._warned = True
                    return op(self._fallback)
                await asyncio.sleep(pause)
                pause = min(pause * 2, 0.01)

    async def reserve(self, key_id: str, limits: Limits, tokens: int, cost_nanos: int) -> Decision:
        return await self._apply(key_id, lambda lim: lim.reserve_now(key_id, limits, tokens, cost_nanos))

    async def settle(self, key_id: str, limits: Limits, refund_tokens: int, hold_nanos: int, cost_nanos: int) -> None:
        await self._apply(key_id, lambda lim: lim.settle_now(key_id, limits, refund_tokens, hold_nanos, cost_nanos))

    async def peek(self, key_id: str, limits: Limits) -> Snapshot:
        return await self._apply(key_id, lambda lim: lim._snapshot(lim._state(key_id, limits), limits))

    async def close(self) -> None:
        self._conn.close()
