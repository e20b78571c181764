"""The prompt-cache ledger's records: its limits, one entry per holder, a request's lease, and
the prefix test that decides whether a holder's KV is worth reusing."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class CacheLimits:
    holders: int  # cached sequences that can be resident at once (one per holder)
    max_active: int  # requests generating at once; at most ``holders``
    max_tokens: int  # tokens that idle cached sequences may hold in total
    enabled: bool = True
    ttl_scale: float = 1.0  # multiplies every TTL; tests shorten them with it
    bytes_per_token: int = 0  # KV bytes per cached token, for reporting only (0: unknown)
    groups: Mapping[str, str] = field(default_factory=dict)  # key id -> shared namespace


@dataclass
class Entry:
    namespace: str
    model: str
    text: str
    tokens: int
    expires_at: float
    last_used: float


@dataclass(frozen=True)
class Lease:
    holder: int
    namespace: str
    reuse: bool
    ttl_seconds: float
    previous: Entry | None = None  # the entry this lease extends (a planned hit)
    model: str = ""


def common_prefix_len(a: str, b: str) -> int:
    n = min(len(a), len(b))
    lo, hi = 0, n
    # Binary search on slice equality: C-speed comparisons instead of a Python loop per char.
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def worth_reusing(shared: int, entry_len: int, prompt_len: int) -> bool:
    """Reuse a holder when the shared prefix is most of the entry or most of the new prompt.

    Reusing overwrites the holder's tail, so a short shared header (a common system prompt) is
    not worth destroying another long conversation for while an empty holder is available.
    """
    return shared > 0 and (2 * shared >= entry_len or 2 * shared >= prompt_len)
