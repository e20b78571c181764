"""Which API key the current request belongs to, for per-tenant engine counters.

Set once per request by the admission pass (``gate/admit.py``); engines read it where they
count work (``CallCounters``), so they need no key parameter and no tenant ever sees another's
figures.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

current_owner: ContextVar[str | None] = ContextVar("kimi_current_owner", default=None)


class CallCounters:
    """An engine's calls in flight and calls cancelled by a departed client: in all, for
    operators, and per API key, for each tenant's own view."""

    def __init__(self) -> None:
        self.active = 0
        self.cancelled = 0
        self.active_by: Counter[str] = Counter()
        self.cancelled_by: Counter[str] = Counter()

    def start(self) -> str:
        """A call begins for the current request; returns its owner, for ``end`` and ``cancel``."""
        owner = current_owner.get() or ""
        self.active += 1
        self.active_by[owner] += 1
        return owner

    @contextmanager
    def call(self) -> Iterator[str]:
        """``start`` … ``end`` around a call, counting it cancelled if its client left (the
        generator closed, the task cancelled)."""
        owner = self.start()
        try:
            yield owner
        except (GeneratorExit, asyncio.CancelledError):
            self.cancel(owner)
            raise
        finally:
            self.end(owner)

    def end(self, owner: str) -> None:
        self.active -= 1
        self.active_by[owner] -= 1
        if self.active_by[owner] <= 0:
            del self.active_by[owner]

    def cancel(self, owner: str) -> None:
        self.cancelled += 1
        self.cancelled_by[owner] += 1

    def totals(self) -> dict[str, int]:
        return {"active_calls": self.active, "cancelled_calls": self.cancelled}

    def tenant(self, key_id: str) -> dict[str, int]:
        return {"active_calls": self.active_by[key_id], "cancelled_calls": self.cancelled_by[key_id]}
