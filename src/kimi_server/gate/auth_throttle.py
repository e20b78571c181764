"""Guessing keys costs time: failed authentications (an API key on a tenant route, the admin key
on ``/admin/`` and ``/metrics``, a console sign-in) are counted per client address and per key
prefix, answered more and more slowly, then refused with 429 and ``Retry-After``.

Every place that checks a presented key calls ``AuthThrottle.screen`` with the check itself:

- An address locked by its own failures is refused at once, a right key included: a locked
  guesser must not learn whether its next guess was right. Its count drains at
  ``auth_max_failures / auth_failure_window`` per second, so a locked address may try once more
  every ``window / limit`` seconds, and an address that stops is forgiven within the window.
- A key prefix (the first characters of the presented key, held as a fingerprint) is counted
  over every address, against guessing spread over many. Its lock does not refuse an address
  that authenticated with that prefix lately (``REMEMBER_SECONDS``): the key's own clients keep
  working while it is attacked, and only addresses it has not come from wait out the lock. So
  an attacker cannot lock a key out of the clients already using it, and to lock out anyone it
  must already know the key's first characters. Every prefix has its own, higher, limit.
- A failure waits before its answer, from a quarter of the way to the limit, twice as long
  with each failure, up to ``auth_max_delay`` just before the lock. A success never waits.

A key absent or not a bearer token is not a guess and is not counted, nor is a valid API key
sent where the admin key is needed (``NotTheAdminKey``). The counts live in
Redis when ``redis_url`` is set (every instance alike), else in this process, or in a file
the workers of ``serve --workers`` share. The lock that starts is logged once (the address, or
the prefix's fingerprint: never a key) and counted in ``kimi_auth_lockouts_total``.
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

from starlette.types import Scope

from kimi_server.errors import APIError, PermissionDeniedError, RateLimitError
from kimi_server.gate.failure_counts import Buckets, Drain, FailureCounts, LocalCounts, Tally
from kimi_server.gate.metrics import Metrics
from kimi_server.printable import visible
from kimi_server.settings import Settings

log = logging.getLogger(__name__)
Surface = Literal["api", "admin", "console"]
Check = Callable[[], Awaitable[APIError | None]]  # checks the presented key: why not, or None
PREFIX_CHARS = 12  # counted of a key (at most half of it): "sk-kimi-" and 4 random characters
REMEMBER_SECONDS = 86_400.0
MIN_DELAY = 0.01  # shorter waits are not worth a timer
LOCK_CACHE = 10_000  # addresses this process remembers as locked, to refuse them without a round trip
CLEAR_SECONDS = 1.0  # a right key found unlocked is not looked up again for this long


class AuthThrottled(RateLimitError):
    default_code = "too_many_failed_authentications"


class NotTheAdminKey(PermissionDeniedError):
    """A valid API key where the admin key is needed: refused, but no guess (a scraper set up
    with a tenant's key must not lock its host out of the API), so not counted."""


@dataclass(frozen=True)
class ThrottleLimits:
    address: int  # failures per address within the window; 0: not counted
    prefix: int  # failures per key prefix, all addresses together; 0: not counted
    window: float  # seconds a full count takes to drain
    max_delay: float  # seconds the last failure before a lock waits

    @classmethod
    def from_settings(cls, settings: Settings) -> ThrottleLimits:
        return cls(
            settings.auth_max_failures,
            settings.auth_max_prefix_failures,
            settings.auth_failure_window,
            settings.auth_max_delay,
        )

    @property
    def drain(self) -> Drain:
        return Drain(
            address=(self.address or 1) / self.window,
            prefix=(self.prefix or 1) / self.window,
            remember=REMEMBER_SECONDS,
            keep=2 * self.window + 60,
        )

    def delay(self, level: float, limit: int) -> float:
        """Seconds a failure waits at ``level`` failures of ``limit``: none for the first
        quarter, then doubling up to ``max_delay`` at the last failure before the lock."""
        if not limit or level < limit / 4 or level > limit - 1:
            return 0.0
        wait = self.max_delay * 2.0 ** (level + 1 - limit)
        return wait if wait >= MIN_DELAY else 0.0

    def wait(self, level: float, limit: int) -> float | None:
        """Seconds until a count at ``level`` lets one more attempt through; None: not locked.
        Locked from the ``limit``-th failure in a row (its count, a little drained, is above
        ``limit - 1``) until the count drains back to ``limit - 1``."""
        if not limit or level <= limit - 1:
            return None
        return (level - limit + 1) * self.window / limit


def client_address(scope: Scope) -> str:
    """The address a request is counted under: an IPv6 client by its /64 (one host's share)."""
    client = scope.get("client")
    host = str(client[0]) if client else ""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host[:100] or "-"  # not an IP (a test client, a proxy's odd header): kept short
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


def prefix_fingerprint(token: str) -> str:
    prefix = token[: min(PREFIX_CHARS, len(token) // 2)]
    return hashlib.sha256(b"kimi-auth-prefix\0" + prefix.encode("utf-8", "replace")).hexdigest()[:16]


def buckets_of(address: str, token: str) -> Buckets:
    fingerprint = prefix_fingerprint(token)
    return Buckets(f"a:{address}", f"p:{fingerprint}", f"k:{fingerprint}:{address}")


class AuthThrottle:
    def __init__(self, limits: ThrottleLimits, counts: FailureCounts, metrics: Metrics) -> None:
        self.limits = limits
        self.counts = counts
        self.metrics = metrics
        self._locked: dict[str, float] = {}  # address -> until (monotonic), as last answered here
        self._remembered: dict[str, float] = {}  # known pair -> when this process last wrote it
        self._clear: dict[str, float] = {}  # known pair -> until when it counts as not locked

    @classmethod
    def from_settings(cls, settings: Settings, metrics: Metrics) -> AuthThrottle:
        limits = ThrottleLimits.from_settings(settings)
        counts: FailureCounts
        if settings.redis_url:
            from kimi_server.gate.failure_counts_redis import RedisCounts

            counts = RedisCounts(settings.redis_url, settings.redis_prefix, limits.drain)
        else:
            counts = LocalCounts(limits.drain)
        return cls(limits, counts, metrics)

    @property
    def enabled(self) -> bool:
        return bool(self.limits.address or self.limits.prefix)

    async def screen(self, scope: Scope, token: str | None, surface: Surface, check: Check) -> APIError | None:
        """The answer to an attempt with ``token`` (the presented key): the check's own refusal
        (after its wait), a 429 while the attempt's address or prefix is locked, or None."""
        if not self.enabled or not token:
            return await check()
        address = client_address(scope)
        until = self._locked.get(address)
        if until is not None and until > time.monotonic():  # no check, no round trip
            return self._refuse(until - time.monotonic(), surface, "from this address")
        refusal = await check()
        if isinstance(refusal, NotTheAdminKey):
            return refusal
        buckets = buckets_of(address, token)
        if refusal is None:
            return await self._admitted(buckets, address, surface)
        self.metrics.child(self.metrics.auth_failures, surface).inc()
        tally = await self.counts.add(buckets)
        self._note_lockouts(tally, buckets, address, surface)
        locked = self._lock(tally, address, surface)
        if locked is not None:
            return locked
        delay = max(
            self.limits.delay(tally.address, self.limits.address),
            0.0 if tally.known else self.limits.delay(tally.prefix, self.limits.prefix),
        )
        if delay:
            await asyncio.sleep(delay)
        return refusal

    async def _admitted(self, buckets: Buckets, address: str, surface: Surface) -> APIError | None:
        """A right key: refused still while its address or prefix is locked. A pair found clear
        is not read again for ``CLEAR_SECONDS``, so a busy client costs the counts (a Redis
        round trip, where they live there) about once a second, not once a request."""
        now = time.monotonic()
        if self._clear.get(buckets.known, 0.0) > now:
            return None
        tally = await self.counts.read(buckets)
        locked = self._lock(tally, address, surface)
        if locked is None:
            if len(self._clear) >= LOCK_CACHE:
                self._clear.clear()
            self._clear[buckets.known] = now + CLEAR_SECONDS
            await self._remember(buckets.known)
        return locked

    def _lock(self, tally: Tally, address: str, surface: Surface) -> APIError | None:
        by_address = self.limits.wait(tally.address, self.limits.address)
        by_prefix = None if tally.known else self.limits.wait(tally.prefix, self.limits.prefix)
        if by_address is not None and (by_prefix is None or by_address >= by_prefix):
            if len(self._locked) >= LOCK_CACHE:
                self._locked.clear()
            self._locked[address] = time.monotonic() + by_address
            return self._refuse(by_address, surface, "from this address")
        if by_prefix is not None:
            return self._refuse(by_prefix, surface, "with keys like this one")
        return None

    def _refuse(self, seconds: float, surface: Surface, whose: str) -> APIError:
        self.metrics.child(self.metrics.auth_throttled, surface).inc()
        retry = max(1, math.ceil(seconds))
        return AuthThrottled(f"Too many failed authentications {whose}: try again in {retry} s.", retry_after=retry)

    def _note_lockouts(self, tally: Tally, buckets: Buckets, address: str, surface: Surface) -> None:
        """One log line and one count per lock that this failure started (never the key)."""
        for level, limit, what, scope in (
            (tally.address, self.limits.address, f"address {visible(address)}", "address"),
            (tally.prefix, self.limits.prefix, f"key prefix #{buckets.prefix[2:10]}", "key_prefix"),
        ):
            if limit and level - 1 <= limit - 1 < level:
                wait = self.limits.wait(level, limit) or 0.0
                self.metrics.child(self.metrics.auth_lockouts, scope).inc()
                log.warning(
                    "authentication lockout: %s after %d failed authentications (the last on %s); refused for %d s",
                    what,
                    round(level),
                    surface,
                    math.ceil(wait),
                )

    async def _remember(self, known: str) -> None:
        """Marks the pair known; written again only when a quarter of its time has passed."""
        now = time.monotonic()
        last = self._remembered.get(known)
        if last is not None and now - last < REMEMBER_SECONDS / 4:
            return
        if len(self._remembered) >= LOCK_CACHE:
            self._remembered.clear()
        self._remembered[known] = now
        await self.counts.remember(known)

    async def close(self) -> None:
        await self.counts.close()
