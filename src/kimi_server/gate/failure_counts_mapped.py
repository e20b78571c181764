"""The failure counts of ``failure_counts.py`` shared by the worker processes of one server
(``serve --workers``) through a memory-mapped file, for when no Redis is configured.

The file is a fixed hash table of buckets (open addressing on a digest of the bucket's name),
read and written under an exclusive ``flock``, as ``shared_limits.py`` does for the rate limits:
a few microseconds of arithmetic on shared pages, no I/O. Each slot says when it falls empty
(its count drained, or its "known" mark expired), so an emptied slot is taken by the next
bucket that needs room: addresses that come and go do not fill the table. A table with no room
left, or a file that fails, leaves this worker counting alone, said once in the log.
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

from kimi_server.gate.failure_counts import Buckets, Drain, LocalCounts, Tally, drained

log = logging.getLogger(__name__)
T = TypeVar("T")

SLOTS = 1 << 16
PROBES = 64
_SLOT = struct.Struct("<16sddd")  # digest, level, when it was set, when it falls empty
_EMPTY = bytes(16)


def _digest(bucket: str) -> bytes:
    digest = hashlib.blake2b(bucket.encode(), digest_size=16).digest()
    return digest if digest != _EMPTY else b"\x01" + digest[1:]


class MappedCounts:
    def __init__(self, path: Path, drain: Drain, slots: int = SLOTS, clock: Callable[[], float] = time.time) -> None:
        self.slots = slots
        self._drain = drain
        self._clock = clock  # wall clock: the workers share the machine's
        size = slots * _SLOT.size
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            if os.fstat(self._fd).st_size < size:
                os.ftruncate(self._fd, size)  # zero-filled: every slot free
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        self._map = mmap.mmap(self._fd, size)
        self._local = LocalCounts(drain)
        self._warned = False

    def _slot(self, bucket: str, now: float, take: bool) -> int | None:
        """The offset of the bucket's slot; with ``take``, a free or emptied one is taken for a
        bucket that has none. None: no slot (not counted yet, or no room)."""
        digest = _digest(bucket)
        start = int.from_bytes(digest[:8], "little") % self.slots
        spare = None
        for probe in range(min(PROBES, self.slots)):
            offset = ((start + probe) % self.slots) * _SLOT.size
            held, _, _, empty_at = _SLOT.unpack_from(self._map, offset)
            if held == digest:
                return offset
            if spare is None and (held == _EMPTY or empty_at <= now):
                spare = offset
        if spare is not None and take:
            _SLOT.pack_into(self._map, spare, digest, 0.0, now, now)
            return spare
        if spare is None and take:
            raise _Full
        return None

    def _level(self, bucket: str, rate: float, now: float) -> float:
        offset = self._slot(bucket, now, take=False)
        if offset is None:
            return 0.0
        _, level, at, _ = _SLOT.unpack_from(self._map, offset)
        return drained(level, at, rate, now)

    def _count(self, offset: int, rate: float, now: float) -> float:
        digest, level, at, _ = _SLOT.unpack_from(self._map, offset)
        level = drained(level, at, rate, now) + 1
        _SLOT.pack_into(self._map, offset, digest, level, now, now + level / rate)
        return level

    def _known(self, bucket: str, now: float) -> bool:
        offset = self._slot(bucket, now, take=False)
        return offset is not None and _SLOT.unpack_from(self._map, offset)[3] > now

    def _read(self, buckets: Buckets) -> Tally:
        now = self._clock()
        return Tally(
            self._level(buckets.address, self._drain.address, now),
            self._level(buckets.prefix, self._drain.prefix, now),
            self._known(buckets.known, now),
        )

    def _add(self, buckets: Buckets) -> Tally:
        now = self._clock()
        # Both slots first: a table too full for the second leaves neither counted here.
        address = self._slot(buckets.address, now, take=True)
        prefix = self._slot(buckets.prefix, now, take=True)
        assert address is not None and prefix is not None
        return Tally(
            self._count(address, self._drain.address, now),
            self._count(prefix, self._drain.prefix, now),
            self._known(buckets.known, now),
        )

    def _remember(self, known: str) -> None:
        now = self._clock()
        offset = self._slot(known, now, take=True)
        assert offset is not None
        _SLOT.pack_into(self._map, offset, _digest(known), 1.0, now, now + self._drain.remember)

    def _apply(self, shared: Callable[[], T], alone: Callable[[], T]) -> T:
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                return shared()
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
        except (_Full, OSError, ValueError, struct.error) as exc:
            if not self._warned:
                why = "the table is full" if isinstance(exc, _Full) else f"the file failed ({type(exc).__name__})"
                log.warning("shared failed-sign-in counts: %s; this worker counts alone for now", why)
                self._warned = True
            return alone()

    async def read(self, buckets: Buckets) -> Tally:
        return self._apply(lambda: self._read(buckets), lambda: self._local.read_now(buckets))

    async def add(self, buckets: Buckets) -> Tally:
        return self._apply(lambda: self._add(buckets), lambda: self._local.add_now(buckets))

    async def remember(self, known: str) -> None:
        self._apply(lambda: self._remember(known), lambda: self._local.remember_now(known))

    async def close(self) -> None:
        if not self._map.closed:
            self._map.close()
            os.close(self._fd)


class _Full(Exception):
    """No slot left for a bucket among its probes."""
