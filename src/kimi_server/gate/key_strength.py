"""Operator-chosen keys (``--api-key``, ``--admin-key``) checked at start-up: a short or
repetitive key is the one the throttle (``auth_throttle.py``) can only slow, not save.

A key is weak when it is shorter than ``MIN_LENGTH`` characters or its characters carry less
than ``MIN_BITS`` bits by their frequencies in the key (its length times the Shannon entropy of
its characters, counting one period of a repeated key and two characters of a run like
"abcd"). That catches short keys, repeats, runs and small alphabets, not a phrase of
dictionary words, so the advice names a generator. On loopback a weak key is warned about; on
any other address it stops start-up unless ``allow_weak_keys`` says it is meant. The keys the
server makes itself (``gate/key_hash.py:new_key``) carry 256 random bits.
"""

from __future__ import annotations

import ipaddress
import math
from collections import Counter

from kimi_server.settings import Settings

MIN_LENGTH = 20
MIN_BITS = 72.0  # a random 128-bit key (22 base64 characters) always passes
ADVICE = "use a random key, e.g. `openssl rand -base64 32`"


def estimated_bits(key: str) -> float:
    """Bits by character frequencies, of one period of a key that repeats itself; a run of
    consecutive characters (abcd, 1234, dcba) counts as its first two."""
    key = key[: _period(key)]
    kept = [c for n, c in enumerate(key) if n < 2 or not _continues_run(key[n - 2 : n + 1])]
    counts = Counter(kept)
    return -sum(n * math.log2(n / len(kept)) for n in counts.values()) if kept else 0.0


def _continues_run(three: str) -> bool:
    step = ord(three[1]) - ord(three[0])
    return abs(step) == 1 and ord(three[2]) - ord(three[1]) == step


def _period(key: str) -> int:
    """The length of the shortest piece that ``key`` repeats (the whole key if none)."""
    for size in range(1, len(key) // 2 + 1):
        if all(key[n] == key[n % size] for n in range(len(key))):
            return size
    return len(key)


def weakness(key: str) -> str | None:
    """Why ``key`` is weak, or None."""
    if len(key) < MIN_LENGTH:
        return f"is {len(key)} characters long (at least {MIN_LENGTH} wanted)"
    bits = estimated_bits(key)
    if bits < MIN_BITS:
        return f"is too predictable (about {bits:.0f} bits by its characters; at least {MIN_BITS:.0f} wanted)"
    return None


def weak_keys(settings: Settings) -> list[str]:
    """One line per weak operator key, naming which (never the key)."""
    named = [("the admin key (--admin-key)", settings.admin_key)] if settings.admin_key else []
    named += [(f"API key {n} of {len(settings.api_keys)} (--api-key)", k) for n, k in enumerate(settings.api_keys, 1)]
    return [f"{name} {why}" for name, key in named if (why := weakness(key)) is not None]


def loopback_only(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_operator_keys(settings: Settings) -> list[str]:
    """Warnings to print at start-up; raises ValueError where a weak key may not be used."""
    found = weak_keys(settings)
    if not found:
        return []
    if loopback_only(settings.host) or settings.allow_weak_keys:
        return [f"{line}: {ADVICE}" for line in found]
    raise ValueError(
        f"{'; '.join(found)}. On {settings.host}, beyond loopback, a weak key can be guessed: {ADVICE}, "
        "or set allow_weak_keys = true (KIMI_ALLOW_WEAK_KEYS=true) to serve with it anyway"
    )
