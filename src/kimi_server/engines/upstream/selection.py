"""The order in which a route's upstreams are tried: weighted random first pick, the rest as
failover in weighted random order too, so load spreads by weight and a failure moves on."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def weighted_order(items: Sequence[T], weights: Sequence[int], rng: random.Random | None = None) -> list[T]:
    pool = list(zip(items, weights, strict=True))
    pick = rng or random
    out: list[T] = []
    while pool:
        total = sum(w for _, w in pool)
        r = pick.uniform(0, total)
        for i, (item, w) in enumerate(pool):
            r -= w
            if r <= 0 or i == len(pool) - 1:
                out.append(item)
                del pool[i]
                break
    return out
