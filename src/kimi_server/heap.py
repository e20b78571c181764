"""The garbage collector set for a long-running server, once its app is built.

Everything loaded by then (modules, the app, its routes and models) lives as long as the
process, yet every full collection would walk it again. Frozen, it is skipped; and collecting
the youngest objects every 10,000 allocations instead of 700 lets a request's short-lived
objects die by reference counting before a collection looks at them. Measured on the relay
path: about 15% less CPU per request. Not done by ``create_app`` itself: tests build many apps
in one process, and frozen objects are never freed.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 10_000


def settle_heap() -> None:
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
