"""Failed authentications counted in buckets that drain at a steady rate (``auth_throttle.py``
decides what the counts mean).

Each attempt names three buckets: its client address, the prefix of the key it presented (a
fingerprint, never the characters), and the pair of both, which is "known" once that address
has authenticated with that prefix. A count is a level that rises by one per failure and drains
at ``limit / window`` per second, so an address that stops failing is forgiven in one window
and one that keeps failing is held at its limit. This module keeps the counts in this process;
``failure_counts_redis.py`` (every instance) and ``failure_counts_mapped.py`` (the workers of
one server) keep them where several processes see them alike.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

MAX_ENTRIES = 100_000  # buckets one process keeps; drained ones go first when it is full


@dataclass(frozen=True)
class Buckets:
    address: str
    prefix: str
    known: str  # the address and the prefix together


@dataclass(frozen=True)
class Tally:
    """The counts after an attempt, drained to now."""

    address: float
    prefix: float
    known: bool  # the address authenticated with this prefix lately


@dataclass(frozen=True)
class Drain:
    address: float  # failures forgiven per second on an address
    prefix: float  # ... on a key prefix
    remember: float  # seconds an address stays known for a prefix after it authenticated
    keep: float  # seconds an idle count is kept: more than a full count takes to drain


class FailureCounts(Protocol):
    async def read(self, buckets: Buckets) -> Tally: ...

    async def add(self, buckets: Buckets) -> Tally:
        """Counts one failure on the address and on the prefix; the counts after it."""
        ...

    async def remember(self, known: str) -> None:
        """The address of ``known`` authenticated with its prefix."""
        ...

    async def close(self) -> None: ...


def drained(level: float, at: float, rate: float, now: float) -> float:
    return max(0.0, level - max(0.0, now - at) * rate)


class LocalCounts:
    """The counts of this process alone."""

    def __init__(self, drain: Drain, clock: Callable[[], float] = time.monotonic) -> None:
        self.drain = drain
        self.clock = clock
        self._levels: dict[str, tuple[float, float]] = {}  # bucket -> (level, when it was set)
        self._known: dict[str, float] = {}  # bucket -> until

    def read_now(self, buckets: Buckets) -> Tally:
        now = self.clock()
        return Tally(
            self._level(buckets.address, self.drain.address, now),
            self._level(buckets.prefix, self.drain.prefix, now),
            self._known.get(buckets.known, 0.0) > now,
        )

    def add_now(self, buckets: Buckets) -> Tally:
        now = self.clock()
        address = self._set(buckets.address, self._level(buckets.address, self.drain.address, now) + 1, now)
        prefix = self._set(buckets.prefix, self._level(buckets.prefix, self.drain.prefix, now) + 1, now)
        return Tally(address, prefix, self._known.get(buckets.known, 0.0) > now)

    def remember_now(self, known: str) -> None:
        now = self.clock()
        if len(self._known) >= MAX_ENTRIES:
            self._known = {k: until for k, until in self._known.items() if until > now}
            while len(self._known) >= MAX_ENTRIES:
                del self._known[next(iter(self._known))]
        self._known.pop(known, None)
        self._known[known] = now + self.drain.remember

    def _level(self, bucket: str, rate: float, now: float) -> float:
        held = self._levels.get(bucket)
        return drained(held[0], held[1], rate, now) if held is not None else 0.0

    def _set(self, bucket: str, level: float, now: float) -> float:
        self._levels.pop(bucket, None)  # re-inserted last: the oldest entries come first
        if len(self._levels) >= MAX_ENTRIES:
            self._prune(now)
        self._levels[bucket] = (level, now)
        return level

    def _prune(self, now: float) -> None:
        rate = min(self.drain.address or 1.0, self.drain.prefix or 1.0)
        self._levels = {b: (lv, at) for b, (lv, at) in self._levels.items() if drained(lv, at, rate, now) > 0}
        while len(self._levels) >= MAX_ENTRIES:  # a flood of addresses: the oldest are forgotten
            del self._levels[next(iter(self._levels))]

    async def read(self, buckets: Buckets) -> Tally:
        return self.read_now(buckets)

    async def add(self, buckets: Buckets) -> Tally:
        return self.add_now(buckets)

    async def remember(self, known: str) -> None:
        self.remember_now(known)

    async def close(self) -> None:
        return None
