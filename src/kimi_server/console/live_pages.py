"""Live state (the admin key only): requests in flight, queue depth, refusals, prompt-cache
hit rate, each upstream's breaker; the panel is re-fetched by htmx every few seconds.

The figures are read from what ``/metrics`` shows (``Metrics.collected``): in one process its
own series, under ``serve --workers`` every worker's, summed as ``/metrics`` sums them, so the
page does not change with the worker that happens to answer it.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from kimi_server.console.session import Viewer, admin_viewer
from kimi_server.console.web import page
from kimi_server.engines.upstream.engine import UpstreamEngine
from kimi_server.gate.engine_metrics import GAUGES
from kimi_server.gate.metrics import Metrics, multiprocess
from kimi_server.http.state import app_state
from kimi_server.http.upstream_health import deep_health

router = APIRouter(prefix="/console/live", include_in_schema=False)
Samples = dict[str, list[tuple[dict[str, str], float]]]


def _samples(metrics: Metrics) -> Samples:
    """Every sample ``/metrics`` would show, by name."""
    found: Samples = defaultdict(list)
    for family in metrics.collected().collect():
        for sample in family.samples:
            found[sample.name].append((sample.labels, sample.value))
    return found


def _by(samples: Samples, name: str, label: str) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for labels, value in samples.get(name, []):
        out[labels.get(label, "")] += value
    return out


def _engines(samples: Samples) -> list[dict[str, Any]]:
    columns = {key: _by(samples, name, "engine") for name, (_, key) in GAUGES.items()}
    refused = _by(samples, "kimi_queue_refusals_total", "engine")
    cache: dict[str, dict[str, float]] = defaultdict(dict)
    for labels, value in samples.get("kimi_engine_prompt_cache", []):
        cache[labels["engine"]][labels["counter"]] = cache[labels["engine"]].get(labels["counter"], 0) + value
    rows = []
    for engine in sorted(columns["queue_slots"]):
        lookups, hits = cache[engine].get("requests", 0), cache[engine].get("hits", 0)
        row: dict[str, Any] = {key: int(column.get(engine, 0)) for key, column in columns.items()}
        row.update(engine=engine, refused=int(refused.get(engine, 0)))
        row["hit_rate"] = f"{100 * hits / lookups:.0f}%" if lookups else "none yet"
        rows.append(row)
    return rows


def _upstreams(request: Request, samples: Samples) -> list[dict[str, Any]]:
    engines = app_state(request).engines
    served: dict[int, list[str]] = {}
    for model_id, engine in sorted(engines.by_model.items()):
        served.setdefault(id(engine), []).append(model_id)
    # How many workers see each upstream in each state (one, in one process).
    seen: dict[tuple[str, str], dict[str, int]] = defaultdict(dict)
    for labels, value in samples.get("kimi_upstream_breaker_state", []):
        if value:
            seen[(labels["engine"], labels["upstream"])][labels["state"]] = int(value)
    rows = []
    for engine in engines.unique():
        if isinstance(engine, UpstreamEngine):
            for up in engine.upstreams:
                states = seen.get((engine.name, up.name)) or {up.breaker.state: 1}
                models = served[id(engine)]
                rows.append({"name": up.name, "dialect": up.cfg.dialect, "states": states, "models": models})
    return rows


def _figures(request: Request) -> dict[str, Any]:
    samples = _samples(request.app.state.kimi_metrics)
    return {
        "engines": _engines(samples),
        "upstreams": _upstreams(request, samples),
        "gateway": {
            "streams": int(sum(_by(samples, "kimi_streams_in_flight", "").values())),
            "refusals": {k: int(v) for k, v in sorted(_by(samples, "kimi_rejections_total", "reason").items()) if v},
        },
        "every_worker": multiprocess(),
    }


@router.get("")
async def live(request: Request, who: Viewer = Depends(admin_viewer)) -> Response:
    return page(request, "live.html", who, **_figures(request))


@router.get("/panel")
async def panel(request: Request, who: Viewer = Depends(admin_viewer)) -> Response:
    return page(request, "live_panel.html", who, **_figures(request))


@router.get("/health")
async def health(request: Request, who: Viewer = Depends(admin_viewer)) -> Response:
    """``/health?deep=1``'s check, on demand: a real one-token call per model and upstream."""
    report = await deep_health(app_state(request).engines)
    return page(request, "live_health.html", who, report=report)
