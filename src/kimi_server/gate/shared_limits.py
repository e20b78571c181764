"""The limits of ``limits.py`` shared by the worker processes of one server (``serve --workers``)
through a memory-mapped file, for when no Redis is configured.

The file is a fixed hash table of per-key buckets (open addressing on a digest of the key id).
Each call takes an exclusive ``flock`` on the file, reads the key's slot, runs
``LocalLimiter``'s own arithmetic on it and writes it back: so a check and its reservation are
one atomic step across the workers, and the figures are those one process would have. The lock
is held for a few microseconds of arithmetic and no I/O (the pages are shared memory), so taking
it blocking, on the event loop, costs less than any asynchronous hand-off would; a SQLite file
here cost a transaction per call and serialised the workers. Times are wall-clock seconds (the
workers share the machine's clock). A table that is full, or a file that fails, leaves the key
limited by this worker alone, and says so in the log once.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import mmap
import os
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from kimi_server.gate.limits import Decision, Limits, LocalLimiter, Snapshot, _Bucket, _KeyState

log = logging.getLogger(__name__)
T = TypeVar("T")

SLOTS = 1 << 16  # keys with limits one server can track across workers; the file is sparse
PROBES = 64  # slots looked at before the table counts as full for a key
# digest, then the key's state: requests level and time, tokens level and time, spent, held,
# budget period.
_SLOT = struct.Struct("<16sddddqqq")
_EMPTY = bytes(16)


def _digest(key_id: str) -> bytes:
    digest = hashlib.blake2b(key_id.encode(), digest_size=16).digest()
    return digest if digest != _EMPTY else b"\x01" + digest[1:]  # all-zero marks a free slot


class MappedLimiter:
    def __init__(self, path: Path, slots: int = SLOTS) -> None:
        self.slots = slots
        size = slots * _SLOT.size
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            if os.fstat(self._fd).st_size < size:
                os.ftruncate(self._fd, size)  # zero-filled: every slot free
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        self._map = mmap.mmap(self._fd, size)
        self._work = LocalLimiter(clock=time.time)  # the arithmetic, on one key loaded at a time
        self._fallback = LocalLimiter()
        self._slot_of: dict[str, int] = {}  # a key's slot never moves once taken
        self._warned = False

    def _find(self, key_id: str) -> int | None:
        """The key's slot (taken for it if new); None when the table has no room for it. Called
        with the lock held."""
        known = self._slot_of.get(key_id)
        if known is not None:
            return known
        digest = _digest(key_id)
        start = int.from_bytes(digest[:8], "little") % self.slots
        for probe in range(min(PROBES, self.slots)):
            index = (start + probe) % self.slots
            offset = index * _SLOT.size
            held = self._map[offset : offset + 16]
            if held in (digest, _EMPTY):
                if held == _EMPTY:
                    self._map[offset : offset + 16] = digest  # the rest is zero: a fresh key
                self._slot_of[key_id] = index
                return index
        return None

    def _locked(self, key_id: str, op: Callable[[LocalLimiter], T]) -> T:
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            index = self._find(key_id)
            if index is None:
                return self._alone(op, "the shared limits table is full")
            offset = index * _SLOT.size
            digest, r_level, r_at, t_level, t_at, spent, held, period = _SLOT.unpack_from(self._map, offset)
            keys = self._work._keys
            keys.clear()
            if r_at or t_at:  # a key seen before (a fresh slot is all zeros)
                keys[key_id] = _KeyState(_Bucket(r_level, r_at), _Bucket(t_level, t_at), spent, held, period)
            result = op(self._work)
            s = keys[key_id]
            _SLOT.pack_into(
                self._map,
                offset,
                digest,
                s.requests.level,
                s.requests.at,
                s.tokens.level,
                s.tokens.at,
                s.spent,
                s.held,
                s.period,
            )
            return result
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _apply(self, key_id: str, op: Callable[[LocalLimiter], T]) -> T:
        try:
            return self._locked(key_id, op)
        except (OSError, ValueError, struct.error) as exc:
            return self._alone(op, f"the shared limits file failed ({type(exc).__name__})")

    def _alone(self, op: Callable[[LocalLimiter], T], why: str) -> T:
        # Like an unreachable Redis: requests go on, limited by this worker alone.
        if not self._warned:
            log.warning("%s: this worker counts alone for now", why)
            self._warned = True
        return op(self._fallback)

    async def reserve(self, key_id: str, limits: Limits, tokens: int, cost_nanos: int) -> Decision:
        return self._apply(key_id, lambda lim: lim.reserve_now(key_id, limits, tokens, cost_nanos))

    async def settle(
        self, key_id: str, limits: Limits, refund_tokens: int, hold_nanos: int, cost_nanos: int, requests: int = 0
    ) -> None:
        self.settle_now(key_id, limits, refund_tokens, hold_nanos, cost_nanos, requests)

    def settle_now(
        self, key_id: str, limits: Limits, refund_tokens: int, hold_nanos: int, cost_nanos: int, requests: int = 0
    ) -> None:
        self._apply(key_id, lambda lim: lim.settle_now(key_id, limits, refund_tokens, hold_nanos, cost_nanos, requests))

    async def peek(self, key_id: str, limits: Limits) -> Snapshot:
        return self._apply(key_id, lambda lim: lim._snapshot(lim._state(key_id, limits), limits))

    async def close(self) -> None:
        if not self._map.closed:
            self._map.close()
            os.close(self._fd)
