"""``GET /health?deep=1`` (authenticated): what serves each model id, and whether it answers.

- the embedded model: its file name, the ids it serves, and one real output token through the
  engine (the utility slot, bounded in time: ``engines/llamacpp/health.py``);
- each upstream: its breaker state, whether ``GET …/models`` lists the model this server asks
  for, and one real call of one output token (``engines/upstream/health.py``).

``status`` is "ok" when every one answered, else "degraded"; a failure carries ``reason``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

from kimi_server.engines.upstream.engine import UpstreamEngine
from kimi_server.engines.upstream.health import check_upstream, upstream_names
from kimi_server.serving.common import EngineSet


async def deep_health(engines: EngineSet) -> dict[str, Any]:
    served: dict[int, list[str]] = {}
    for model_id, engine in sorted(engines.by_model.items()):
        served.setdefault(id(engine), []).append(model_id)
    models: list[Awaitable[dict[str, Any]]] = []
    upstreams: list[Awaitable[dict[str, Any]]] = []
    seen: set[tuple[str, str, tuple[str, ...]]] = set()
    for engine in engines.unique():
        ids = served[id(engine)]
        if isinstance(engine, UpstreamEngine):
            for up in engine.upstreams:
                key = (up.base, up.cfg.dialect, tuple(upstream_names(up, ids)))
                if key not in seen:  # one upstream behind several routes is probed once
                    seen.add(key)
                    upstreams.append(_labelled(check_upstream(up, ids, call=True), ids))
        elif hasattr(engine, "probe"):
            models.append(_labelled(engine.probe(), ids))
    reports = await asyncio.gather(*models, *upstreams)
    model_reports, upstream_reports = reports[: len(models)], reports[len(models) :]
    ok = all(r.get("ok") for r in (*model_reports, *upstream_reports))
    return {"status": "ok" if ok else "degraded", "models": model_reports, "upstreams": upstream_reports}


async def _labelled(report: Awaitable[dict[str, Any]], ids: list[str]) -> dict[str, Any]:
    return {**await report, "served_as": ids}
