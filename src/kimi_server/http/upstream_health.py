"""``GET /health?deep=1`` (authenticated): each upstream's breaker state and a live probe."""

from __future__ import annotations

import asyncio
from typing import Any

from kimi_server.serving.common import EngineSet


async def deep_health(engines: EngineSet) -> dict[str, Any]:
    probes = [e.health(True) for e in engines.unique() if hasattr(e, "health")]
    reports: list[dict[str, Any]] = []
    seen: set[tuple[str, str]] = set()
    for batch in await asyncio.gather(*probes):
        for report in batch:
            key = (report["name"], report.get("dialect", ""))
            if key not in seen:
                seen.add(key)
                reports.append(report)
    ok = all(r.get("ok") for r in reports)
    return {"status": "ok" if ok else "degraded", "upstreams": reports}
