"""The prompt-cache ledger without a model: TTLs, LRU eviction, the token bound, isolation."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest

from kimi_server.engines.llamacpp.prompt_cache import (
    CacheLimits,
    Lease,
    PromptCacheLedger,
    common_prefix_len,
    worth_reusing,
)

SYSTEM = "<|im_start|>system\nYou are a patient tutor. " * 4
A, B = "key-a", "key-b"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def ledger(clock: Clock, **overrides: Any) -> PromptCacheLedger:
    limits = CacheLimits(holders=2, max_active=2, max_tokens=1000, bytes_per_token=10)
    return PromptCacheLedger(replace(limits, **overrides), clock)


def take(cache: PromptCacheLedger, key: str, text: str, ttl: float = 300) -> Lease:
    lease = cache.try_acquire(key, text, ttl)
    assert lease is not None
    return lease


def run(
    cache: PromptCacheLedger, key: str, text: str, *, ttl: float = 300, cached: int = 0, tokens: int = 100
) -> Lease:
    """One request: lease, then commit what the backend would report."""
    lease = take(cache, key, text, ttl)
    cache.commit(lease, text, tokens, prompt_tokens=tokens, cached_tokens=cached)
    return lease


def test_common_prefix_and_reuse_threshold() -> None:
    assert common_prefix_len("abcdef", "abcxyz") == 3
    assert common_prefix_len("", "abc") == 0
    assert common_prefix_len("abc", "abc") == 3
    assert worth_reusing(60, 100, 1000)  # keeps most of the entry
    assert worth_reusing(600, 5000, 1000)  # serves most of the prompt
    assert not worth_reusing(10, 100, 100)  # only a short shared header
    assert not worth_reusing(0, 0, 0)


def test_same_namespace_reuses_its_own_prefix() -> None:
    cache = ledger(Clock())
    first = run(cache, A, SYSTEM + "Q1")
    assert not first.reuse
    second = take(cache, A, SYSTEM + "Q1")
    assert second.reuse and second.holder == first.holder


def test_other_namespace_never_reuses_and_takes_a_fresh_holder() -> None:
    cache = ledger(Clock())
    first = run(cache, A, SYSTEM + "Q1")
    other = take(cache, B, SYSTEM + "Q1")
    assert not other.reuse
    assert other.holder != first.holder  # A's entry survives on its own holder


def test_another_model_id_never_reuses_the_same_keys_prefix() -> None:
    """One engine may serve several model ids; a prefix written under one is never a cache read
    (billed at that id's cached price) under another, and each id keeps its own entry."""
    cache = ledger(Clock())
    pro = cache.try_acquire(A, SYSTEM + "Q1", 300, model="kimi-k3.1-pro")
    assert pro is not None and not pro.reuse
    cache.commit(pro, SYSTEM + "Q1", 100, prompt_tokens=100, cached_tokens=0)
    k3 = cache.try_acquire(A, SYSTEM + "Q1", 300, model="kimi-k3")
    assert k3 is not None and not k3.reuse and k3.holder != pro.holder
    cache.commit(k3, SYSTEM + "Q1", 100, prompt_tokens=100, cached_tokens=0)
    again = cache.try_acquire(A, SYSTEM + "Q1", 300, model="kimi-k3")
    assert again is not None and again.reuse and again.holder == k3.holder
    # With one holder, the other id's entry is overwritten from scratch, never lent.
    single = ledger(Clock(), holders=1, max_active=1)
    first = single.try_acquire(A, SYSTEM + "Q1", 300, model="kimi-k3.1-pro")
    assert first is not None
    single.commit(first, SYSTEM + "Q1", 100, prompt_tokens=100, cached_tokens=0)
    other = single.try_acquire(A, SYSTEM + "Q2", 300, model="kimi-k3")
    assert other is not None and other.holder == first.holder and not other.reuse


def test_other_namespace_evicts_lru_but_still_recomputes() -> None:
    clock = Clock()
    cache = ledger(clock)
    run(cache, A, SYSTEM + "old")
    clock.now += 1
    run(cache, A, "<|im_start|>user\nsomething else entirely")
    clock.now += 1
    lease = take(cache, B, SYSTEM + "old")
    # B displaced A's least recently used entry, and may not reuse a byte of it.
    assert not lease.reuse
    stats = cache.stats(A)
    assert stats.own.evictions == 1
    assert stats.own_held.entries == 1


def test_ttl_expiry_is_a_miss_and_counted() -> None:
    clock = Clock()
    cache = ledger(clock)
    run(cache, A, SYSTEM + "Q1", ttl=300)
    clock.now += 299
    lease = take(cache, A, SYSTEM + "Q1")
    assert lease.reuse
    cache.commit(lease, SYSTEM + "Q1", 100, prompt_tokens=100, cached_tokens=99)
    clock.now += 299  # sliding: the read 299 s ago renewed it
    lease = take(cache, A, SYSTEM + "Q1")
    assert lease.reuse
    cache.commit(lease, SYSTEM + "Q1", 100, prompt_tokens=100, cached_tokens=99)
    clock.now += 301
    lease = take(cache, A, SYSTEM + "Q1")
    assert not lease.reuse
    assert cache.stats(A).own.expirations == 1


def test_ttl_scale_shortens_ttls() -> None:
    clock = Clock()
    cache = ledger(clock, ttl_scale=0.01)
    run(cache, A, SYSTEM, ttl=300)
    clock.now += 3.1
    assert not take(cache, A, SYSTEM).reuse


def test_a_short_ttl_read_keeps_a_longer_expiry() -> None:
    clock = Clock()
    cache = ledger(clock)
    run(cache, A, SYSTEM, ttl=3600)
    clock.now += 10
    run(cache, A, SYSTEM + "more", ttl=300, cached=90)
    clock.now += 1000  # past 5 minutes, inside the hour the first write bought
    assert take(cache, A, SYSTEM + "more").reuse


def test_lru_eviction_picks_least_recently_used() -> None:
    clock = Clock()
    cache = ledger(clock)
    first = run(cache, A, "first conversation " * 10)
    clock.now += 1
    second = run(cache, A, "second conversation " * 10)
    clock.now += 1
    run(cache, A, "first conversation " * 10, cached=90)  # a hit makes the first recent
    clock.now += 1
    third = take(cache, A, "third conversation " * 10)
    assert third.holder == second.holder != first.holder
    assert cache.stats(A).own.evictions == 1


def test_token_bound_evicts_idle_entries_and_reports_it() -> None:
    clock = Clock()
    cache = ledger(clock, max_tokens=250)
    run(cache, A, "one " * 50, tokens=150)
    clock.now += 1
    run(cache, B, "two " * 50, tokens=150)
    stats = cache.stats(B)
    assert stats.server_held.tokens == 150
    assert stats.server_held.bytes == 1500
    assert stats.server.evictions == 1
    # The evicted prefix is a miss next time, not a hit.
    assert not take(cache, A, "one " * 50).reuse


def test_a_prompt_larger_than_the_bound_is_not_written() -> None:
    cache = ledger(Clock(), max_tokens=50)
    lease = take(cache, A, SYSTEM)
    assert not cache.commit(lease, SYSTEM, 100, prompt_tokens=100, cached_tokens=0)
    assert cache.stats(A).own.written_tokens == 0
    assert not take(cache, A, SYSTEM).reuse


def test_disabled_cache_never_reuses_or_writes() -> None:
    cache = ledger(Clock(), enabled=False)
    lease = take(cache, A, SYSTEM)
    assert not cache.commit(lease, SYSTEM, 100, prompt_tokens=100, cached_tokens=0)
    assert not take(cache, A, SYSTEM).reuse


def test_abandoned_holder_is_nobodys_cache() -> None:
    cache = ledger(Clock())
    run(cache, A, SYSTEM)
    lease = take(cache, A, SYSTEM)
    assert lease.reuse
    cache.abandon(lease)
    assert not take(cache, A, SYSTEM).reuse


def test_shared_group_reuses_across_its_keys_only() -> None:
    cache = ledger(Clock(), groups={A: "team", B: "team"}, holders=3, max_active=3)
    run(cache, A, SYSTEM)
    assert take(cache, B, SYSTEM).reuse
    assert not take(cache, "key-c", SYSTEM).reuse


def test_counters_follow_what_the_backend_reported() -> None:
    cache = ledger(Clock())
    run(cache, A, SYSTEM, tokens=100)
    run(cache, A, SYSTEM, tokens=100, cached=99)
    lease = take(cache, A, SYSTEM)
    # Planned a hit, but the backend had dropped the KV: a miss, and "lost", never a hit.
    cache.commit(lease, SYSTEM, 100, prompt_tokens=100, cached_tokens=0)
    own = cache.stats(A).own
    assert (own.requests, own.hits, own.misses, own.lost) == (3, 1, 2, 1)
    assert own.cached_tokens == 99
    assert own.written_tokens == 100 + 1 + 100
    assert cache.stats(B).own.requests == 0  # another key sees none of A's counters


def test_max_active_limits_concurrent_leases() -> None:
    cache = ledger(Clock(), holders=3, max_active=1)
    lease = take(cache, A, SYSTEM)
    assert cache.try_acquire(B, SYSTEM, 300) is None
    cache.abandon(lease)
    assert cache.try_acquire(B, SYSTEM, 300) is not None


def test_acquire_waits_for_a_free_holder() -> None:
    async def scenario() -> tuple[int, bool]:
        cache = ledger(Clock(), holders=1, max_active=1)
        first = await cache.acquire(A, SYSTEM, 300)
        waiting = asyncio.ensure_future(cache.acquire(B, SYSTEM, 300))
        await asyncio.sleep(0)
        blocked = not waiting.done()
        cache.commit(first, SYSTEM, 100, prompt_tokens=100, cached_tokens=0)
        second = await asyncio.wait_for(waiting, 5)
        return second.holder, blocked and not second.reuse

    assert asyncio.run(scenario()) == (0, True)


def test_limits_are_checked() -> None:
    with pytest.raises(ValueError, match="max_active <= holders"):
        PromptCacheLedger(CacheLimits(holders=1, max_active=2, max_tokens=10))


def test_uncovered_kv_is_scrubbed_before_the_holder_is_used_again() -> None:
    clock = Clock()
    cache = ledger(clock, holders=1, max_active=1)
    run(cache, A, SYSTEM, ttl=300)
    assert cache.take_stale() == []  # a live entry is not scrubbed
    clock.now += 301
    lease = take(cache, A, SYSTEM)
    assert not lease.reuse  # expired: recomputed from scratch
    cache.abandon(lease)
    assert cache.take_stale() == [0]  # abandoned: content unknown
    assert cache.try_acquire(B, SYSTEM, 300) is None  # not usable while being scrubbed
    cache.scrubbed(0)
    assert cache.try_acquire(B, SYSTEM, 300) is not None


def test_token_bound_evictions_are_scrubbed_but_victims_are_not() -> None:
    clock = Clock()
    cache = ledger(clock, max_tokens=250)
    run(cache, A, "one " * 50, tokens=150)
    clock.now += 1
    run(cache, B, "two " * 50, tokens=150)  # evicts A's entry for the bound
    assert cache.take_stale() == [0]
    cache.scrubbed(0)
    cache2 = ledger(clock, holders=1, max_active=1)
    run(cache2, A, "one " * 50)
    run(cache2, B, "two " * 50)  # A's entry was the victim, overwritten by B's request
    assert cache2.take_stale() == []
    assert cache2.stats(A).own.evictions == 1


def test_totals_are_flat_counters() -> None:
    cache = ledger(Clock())
    run(cache, A, SYSTEM, tokens=100)
    totals = cache.totals()
    assert totals["cache_requests"] == 1
    assert totals["cache_tokens_held"] == 100
    assert totals["cache_bytes_held"] == 1000


def test_a_pinned_runner_refuses_calls_that_do_not_name_a_slot() -> None:
    """Unpinned, llama.cpp would choose a slot itself, maybe one holding another key's prompt."""
    from kimi_server.engines.llamacpp.runner import CompletionRunner

    class NoServer:
        def handle_completions(self, body: dict[str, object], callback: object = None) -> object:
            raise AssertionError("must not be reached")

    async def scenario() -> None:
        runner = CompletionRunner(NoServer(), max_workers=1, pinned=True)
        try:
            with pytest.raises(RuntimeError, match="id_slot"):
                async for _ in runner.stream({"prompt": "hi", "n_predict": 1}):
                    pass
        finally:
            runner.shutdown()

    asyncio.run(scenario())


def test_room_is_made_from_expired_entries_before_live_ones_are_evicted() -> None:
    clock = Clock()
    cache = ledger(clock, max_tokens=250)
    run(cache, A, "one " * 50, tokens=150, ttl=10)
    clock.now += 11  # expired, but nobody looked yet
    run(cache, B, "two " * 50, tokens=150)
    stats = cache.stats(A)
    assert (stats.own.expirations, stats.own.evictions) == (1, 0)
