"""The prompt-cache ledger: which namespace may reuse which cached prefix, and until when.

Engine-agnostic. An engine owns a fixed number of *holders* (for llama.cpp: server slots), each
holding at most one token sequence in its KV cache. The ledger keeps one entry per holder that
says whose sequence it is (namespace), what text it covers and when it expires, and it leases a
holder to every request:

- ``reuse=True`` only when the holder's entry belongs to the request's namespace and model id,
  has not expired and shares a worthwhile prefix with the prompt. The engine then lets the backend reuse
  the holder's KV (llama.cpp ``cache_prompt``).
- Otherwise ``reuse=False``: the engine must recompute the whole prompt on that holder, which
  also leaves the holder's whole content owned by this namespace. So KV one namespace wrote is
  never reused by another (no cross-tenant timing channel), and an expired or evicted prefix is
  a miss that is written again. The same holds across model ids: each id is its own product
  with its own prices, so a prefix written under one is never billed as a cache read under
  another, even where one engine serves both.

The ledger never claims a number of cached tokens: engines report what the backend really reused.
Expiry is sliding: an entry expires ``ttl`` after the end of the last request that wrote or read
it (the longer of the old expiry and the new request's TTL). Everything runs on the event loop;
nothing here is thread-safe.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import fields

from kimi_server.engines.llamacpp.prompt_cache_records import (
    CacheLimits,
    Entry,
    Lease,
    common_prefix_len,
    worth_reusing,
)
from kimi_server.engines.llamacpp.prompt_cache_stats import CacheStats, CacheStatsSource, Counters, Held

log = logging.getLogger(__name__)
__all__ = [
    "CacheLimits",
    "CacheStats",
    "CacheStatsSource",
    "Lease",
    "PromptCacheLedger",
    "common_prefix_len",
    "worth_reusing",
]


class PromptCacheLedger:
    def __init__(self, limits: CacheLimits, clock: Callable[[], float] = time.monotonic) -> None:
        if limits.holders < 1 or not 1 <= limits.max_active <= limits.holders:
            raise ValueError("need 1 <= max_active <= holders")
        self.limits = limits
        self._clock = clock
        self._entries: dict[int, Entry] = {}
        self._leased: set[int] = set()
        # Holders whose KV still holds tokens no entry covers (expired, evicted for the token
        # bound, abandoned): the engine scrubs them so the bound holds for real memory too.
        self._stale: set[int] = set()
        self._scrubbing: set[int] = set()
        self._by_namespace: dict[str, Counters] = {}
        self._waiters: list[asyncio.Future[None]] = []
        # Holders lent to a running request for extra work it can do without (reasoning
        # attempts decoded alongside its own): each with the call that takes it back.
        self._borrowed: dict[int, Callable[[], None]] = {}

    def namespace_of(self, key_id: str) -> str:
        group = self.limits.groups.get(key_id)
        return f"group:{group}" if group is not None else key_id

    # -- leasing ---------------------------------------------------------------------------

    async def acquire(self, key_id: str, text: str, ttl_seconds: float, *, model: str = "") -> Lease:
        """Waits until a holder is free and leases it for one request (under ``model``'s id)."""
        while True:
            lease = self.try_acquire(key_id, text, ttl_seconds, model=model)
            if lease is not None:
                return lease
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)

    def try_acquire(self, key_id: str, text: str, ttl_seconds: float, *, model: str = "") -> Lease | None:
        if len(self._leased) - len(self._borrowed) >= self.limits.max_active:
            return None
        now = self._clock()
        self._expire(now)
        busy = self._leased | self._scrubbing
        free = [h for h in range(self.limits.holders) if h not in busy]
        if not free:
            self._reclaim()
            return None
        namespace = self.namespace_of(key_id)
        ttl = ttl_seconds * self.limits.ttl_scale
        best, shared = self._best_own(free, namespace, model, text)
        if best is not None and self.limits.enabled and worth_reusing(shared, len(self._entries[best].text), len(text)):
            self._leased.add(best)
            # While leased the holder's content changes: its entry leaves the ledger until
            # commit, which extends it (keeping the longer expiry).
            self._reclaim()
            return Lease(best, namespace, True, ttl, self._entries.pop(best), model)
        victim = self._victim(free)
        old = self._entries.get(victim)
        if old is not None:
            self._evict(victim, "room for a new prefix", stale=False)  # overwritten right away
        # The victim is recomputed from scratch even where this namespace wrote it: what it could
        # still lend is at most a prefix not worth reusing (a chat template's opening), and a new
        # prefix then reads as the miss it is, whichever holders happen to be full.
        self._reclaim()
        return self._lease(victim, namespace, model, False, ttl)

    def try_borrow(self, key_id: str, text: str, *, model: str, take_back: Callable[[], None]) -> Lease | None:
        """A free holder lent for work its borrower can do without, or None. Only an empty
        holder or one of the borrower's own namespace is lent (never another tenant's cached
        prefix), and only while the borrower is the one request holding a holder: the engine is
        otherwise idle, so the extra work costs nobody a step. The next request to get a holder
        asks every lent one back: ``take_back`` is called, and the borrower must ``abandon`` the
        lease soon after."""
        if len(self._leased) >= self.limits.max_active or len(self._leased) - len(self._borrowed) > 1:
            return None
        self._expire(self._clock())
        namespace = self.namespace_of(key_id)
        busy = self._leased | self._scrubbing
        free = [h for h in range(self.limits.holders) if h not in busy]
        best, shared = self._best_own(free, namespace, model, text)
        if best is not None and self.limits.enabled and worth_reusing(shared, len(self._entries[best].text), len(text)):
            holder, reuse = best, True
        else:
            lendable = [h for h in free if h not in self._entries or self._entries[h].namespace == namespace]
            if not lendable:
                return None
            holder, reuse = self._victim(lendable), False
            if holder in self._entries:
                self._evict(holder, "lent to a request of its namespace", stale=False)
        previous = self._entries.pop(holder, None)
        self._leased.add(holder)
        self._stale.discard(holder)
        self._borrowed[holder] = take_back
        return Lease(holder, namespace, reuse, 0.0, previous, model)

    def _reclaim(self) -> None:
        for holder, take_back in list(self._borrowed.items()):
            log.info("prompt cache: lent slot %d asked back for another request", holder)
            take_back()

    def _best_own(self, free: list[int], namespace: str, model: str, text: str) -> tuple[int | None, int]:
        best, shared = None, 0
        for holder in free:
            entry = self._entries.get(holder)
            if entry is None or (entry.namespace, entry.model) != (namespace, model):
                continue
            n = common_prefix_len(entry.text, text)
            if n > shared:
                best, shared = holder, n
        return best, shared

    def _victim(self, free: list[int]) -> int:
        """An empty holder, else the least recently used entry's."""
        empty = [h for h in free if h not in self._entries]
        if empty:
            return empty[0]
        return min(free, key=lambda h: self._entries[h].last_used)

    def _lease(self, holder: int, namespace: str, model: str, reuse: bool, ttl: float) -> Lease:
        self._leased.add(holder)
        self._stale.discard(holder)  # recomputed from scratch by this request
        return Lease(holder, namespace, reuse, ttl, model=model)

    # -- settling --------------------------------------------------------------------------

    def commit(self, lease: Lease, text: str, tokens: int, *, prompt_tokens: int, cached_tokens: int) -> bool:
        """Records what the holder now holds; returns whether it stays cached (a write)."""
        now = self._clock()
        self._release(lease.holder)
        counters = self._counters(lease.namespace)
        hit = cached_tokens > 0
        counters.requests += 1
        counters.hits += hit
        counters.misses += not hit
        counters.cached_tokens += cached_tokens
        if lease.previous is not None and not hit:
            counters.lost += 1
        self._expire(now)  # so that the bound below evicts only live entries
        kept = self.limits.enabled and tokens <= self.limits.max_tokens
        if kept:
            expires = now + lease.ttl_seconds
            if lease.previous is not None:
                expires = max(expires, lease.previous.expires_at)
            self._entries[lease.holder] = Entry(lease.namespace, lease.model, text, tokens, expires, now)
            counters.written_tokens += max(prompt_tokens - cached_tokens, 0)
            self._fit(keep=lease.holder)
        elif self.limits.enabled:
            self._stale.add(lease.holder)  # too large to keep: free its memory
        log.debug(
            "prompt cache %s ns=%s holder=%d cached=%d prompt=%d kept=%s",
            "hit" if hit else "miss",
            lease.namespace,
            lease.holder,
            cached_tokens,
            prompt_tokens,
            kept,
        )
        return kept

    def abandon(self, lease: Lease) -> None:
        """The request failed or was cancelled: what the holder holds is unknown, so forget it."""
        self._entries.pop(lease.holder, None)
        self._stale.add(lease.holder)
        self._release(lease.holder)

    def take_stale(self) -> list[int]:
        """Holders to scrub now; each stays unavailable until ``scrubbed``."""
        ready = sorted(self._stale - self._leased - self._scrubbing)
        self._stale.difference_update(ready)
        self._scrubbing.update(ready)
        return ready

    def scrubbed(self, holder: int) -> None:
        self._scrubbing.discard(holder)
        self._wake()

    def _release(self, holder: int) -> None:
        if holder not in self._leased:
            return
        self._leased.discard(holder)
        self._borrowed.pop(holder, None)
        self._wake()

    def _wake(self) -> None:
        # Wake every waiter: each retries, and those that still find nothing wait again.
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._waiters.clear()

    def _fit(self, keep: int) -> None:
        """Evicts least recently used idle entries until the held tokens fit the bound."""
        while self._held_tokens() > self.limits.max_tokens:
            others = [h for h in self._entries if h != keep]
            if not others:
                return
            self._evict(min(others, key=lambda h: self._entries[h].last_used), "token bound")

    def _expire(self, now: float) -> None:
        for holder in [h for h, e in self._entries.items() if e.expires_at <= now]:
            entry = self._entries.pop(holder)
            self._counters(entry.namespace).expirations += 1
            self._stale.add(holder)

    def _evict(self, holder: int, why: str, *, stale: bool = True) -> None:
        entry = self._entries.pop(holder)
        if stale:
            self._stale.add(holder)
        self._counters(entry.namespace).evictions += 1
        log.info(
            "prompt cache eviction (%s): %d tokens of ns=%s, %.0f s before its expiry",
            why,
            entry.tokens,
            entry.namespace,
            entry.expires_at - self._clock(),
        )

    def _counters(self, namespace: str) -> Counters:
        return self._by_namespace.setdefault(namespace, Counters())

    def _held_tokens(self) -> int:
        return sum(e.tokens for e in self._entries.values())

    # -- reporting -------------------------------------------------------------------------

    def leased(self) -> int:
        """Requests holding a slot right now (each is reading its prompt or generating)."""
        return len(self._leased)

    def stats(self, key_id: str) -> CacheStats:
        """Counters for the caller's namespace and for the whole server (no other tenant's)."""
        self._expire(self._clock())
        namespace = self.namespace_of(key_id)
        total = Counters()
        for counters in self._by_namespace.values():
            total.add(counters)
        own = Counters()
        own.add(self._counters(namespace))
        return CacheStats(
            namespace=namespace,
            own=own,
            server=total,
            own_held=self._held(namespace),
            server_held=self._held(None),
            max_tokens=self.limits.max_tokens,
        )

    def totals(self) -> dict[str, int]:
        """Server-wide counters as flat integers (``cache_*``), for operators' metrics."""
        self._expire(self._clock())
        total = Counters()
        for counters in self._by_namespace.values():
            total.add(counters)
        held = self._held(None)
        return {
            **{f"cache_{f.name}": getattr(total, f.name) for f in fields(total)},
            "cache_entries": held.entries,
            "cache_tokens_held": held.tokens,
            "cache_bytes_held": held.bytes or 0,
        }

    def _held(self, namespace: str | None) -> Held:
        entries = [e for e in self._entries.values() if namespace in (None, e.namespace)]
        tokens = sum(e.tokens for e in entries)
        per = self.limits.bytes_per_token
        return Held(len(entries), tokens, tokens * per if per else None)
