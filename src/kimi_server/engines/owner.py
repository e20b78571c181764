"""Which API key the current request belongs to, for per-tenant engine counters.

Set once per request by the admission step (``http/overload.py``); engines read it where they
count work, so they need no key parameter and no tenant ever sees another's figures.
"""

from __future__ import annotations

from contextvars import ContextVar

current_owner: ContextVar[str | None] = ContextVar("kimi_current_owner", default=None)
