"""What the prompt-cache ledger counts, per namespace and for the whole server, and how its
figures are reported (``GET /v1/cache/stats``, the operators' ``cache_*`` metrics)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Protocol, runtime_checkable


@dataclass
class Counters:
    requests: int = 0
    hits: int = 0  # requests that really reused cached KV
    misses: int = 0
    cached_tokens: int = 0
    written_tokens: int = 0
    evictions: int = 0  # unexpired entries dropped for room (before their TTL ran out)
    expirations: int = 0
    lost: int = 0  # granted reuse, but the backend had dropped the KV itself: counted as misses

    def add(self, other: Counters) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


@dataclass
class CacheStats:
    namespace: str
    own: Counters
    server: Counters
    own_held: Held
    server_held: Held
    max_tokens: int

    def merge(self, other: CacheStats) -> None:
        self.own.add(other.own)
        self.server.add(other.server)
        self.own_held = self.own_held.plus(other.own_held)
        self.server_held = self.server_held.plus(other.server_held)
        self.max_tokens += other.max_tokens

    def as_dict(self) -> dict[str, Any]:
        def block(c: Counters, held: Held) -> dict[str, Any]:
            return {
                **{f.name: getattr(c, f.name) for f in fields(c)},
                "entries": held.entries,
                "tokens_held": held.tokens,
                "bytes_held": held.bytes,
            }

        return {
            "object": "prompt_cache.stats",
            "namespace": {"id": self.namespace, **block(self.own, self.own_held)},
            "server": {**block(self.server, self.server_held), "max_tokens": self.max_tokens},
        }


@dataclass(frozen=True)
class Held:
    """What idle cached sequences hold. ``bytes`` is estimated from the model's KV geometry;
    None when that is unknown."""

    entries: int
    tokens: int
    bytes: int | None

    def plus(self, other: Held) -> Held:
        both = None if self.bytes is None or other.bytes is None else self.bytes + other.bytes
        return Held(self.entries + other.entries, self.tokens + other.tokens, both)


@runtime_checkable
class CacheStatsSource(Protocol):
    """Engines with a prompt cache expose its stats through this."""

    def cache_stats(self, key_id: str) -> CacheStats: ...
