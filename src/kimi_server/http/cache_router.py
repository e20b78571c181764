"""``GET /v1/cache/stats``: prompt-cache counters for the caller's namespace.

Only the caller's own figures are shown: server-wide totals would let one key watch another's
traffic arrive (they are in ``gate/queues.py:server_totals``, for operators).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from kimi_server.engines.llamacpp.prompt_cache import CacheStats, CacheStatsSource
from kimi_server.gate.auth import Principal
from kimi_server.http.state import app_state, authenticated
from kimi_server.protocol.common import ErrorBody

router = APIRouter(tags=["Prompt cache"])


@router.get("/v1/cache/stats", responses={401: {"model": ErrorBody}})
async def cache_stats(request: Request, principal: Principal = Depends(authenticated)) -> Any:
    """Hits, misses, writes, evictions and what the prompt cache holds."""
    total: CacheStats | None = None
    for engine in app_state(request).engines.unique():
        if not isinstance(engine, CacheStatsSource):
            continue
        stats = engine.cache_stats(principal.key_id)
        if total is None:
            total = stats
        else:
            total.merge(stats)
    if total is None:
        return {"object": "prompt_cache.stats", "namespace": None, "max_tokens": None}
    # the caller's own namespace only; server totals are for operators.
    body = total.as_dict()
    body["max_tokens"] = body.pop("server")["max_tokens"]
    return body
