"""Live state (the admin key only): requests in flight, queue depth, refusals, prompt-cache
hit rate, each upstream's breaker; the panel is re-fetched by htmx every few seconds.

The figures are the operators' (``http/overload.py:server_totals``, the gateway's counters):
the same numbers ``/metrics`` exports, read in this process.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from kimi_server.console.session import Viewer, admin_viewer
from kimi_server.console.web import page
from kimi_server.engines.upstream.engine import UpstreamEngine
from kimi_server.gate.metrics import Metrics
from kimi_server.http.overload import server_totals
from kimi_server.http.state import app_state
from kimi_server.http.upstream_health import deep_health

router = APIRouter(prefix="/console/live", include_in_schema=False)
REFUSALS = ("queue_rejected_queue_full", "queue_rejected_key_share", "queue_timed_out")


def _engines(request: Request) -> list[dict[str, Any]]:
    rows = []
    for totals in server_totals(request.app):
        lookups = totals.get("cache_requests", 0)
        hits = totals.get("cache_hits", 0)
        rows.append(
            {
                **totals,
                "refused": sum(totals.get(name, 0) for name in REFUSALS),
                "hit_rate": f"{100 * hits / lookups:.0f}%" if lookups else "none yet",
            }
        )
    return rows


def _upstreams(request: Request) -> list[dict[str, Any]]:
    engines = app_state(request).engines
    served: dict[int, list[str]] = {}
    for model_id, engine in sorted(engines.by_model.items()):
        served.setdefault(id(engine), []).append(model_id)
    rows = []
    for engine in engines.unique():
        if isinstance(engine, UpstreamEngine):
            for up in engine.upstreams:
                rows.append(
                    {
                        "name": up.name,
                        "dialect": up.cfg.dialect,
                        "state": up.breaker.state,
                        "models": served.get(id(engine), []),
                    }
                )
    return rows


def _samples(metrics: Metrics, name: str) -> dict[str, float]:
    """A counter's values in this process, by its first label (or "" for none)."""
    found: dict[str, float] = {}
    for family in metrics.registry.collect():
        for sample in family.samples:
            if sample.name in (name, f"{name}_total"):
                label = next(iter(sample.labels.values()), "")
                found[label] = found.get(label, 0) + sample.value
    return found


def _gateway_figures(request: Request) -> dict[str, Any]:
    metrics: Metrics = request.app.state.kimi_metrics
    return {
        "streams": int(sum(_samples(metrics, "kimi_streams_in_flight").values())),
        "refusals": {k: int(v) for k, v in sorted(_samples(metrics, "kimi_rejections").items())},
    }


@router.get("")
async def live(request: Request, who: Viewer = Depends(admin_viewer)) -> Response:
    return page(
        request,
        "live.html",
        who,
        engines=_engines(request),
        upstreams=_upstreams(request),
        gateway=_gateway_figures(request),
    )


@router.get("/panel")
async def panel(request: Request, who: Viewer = Depends(admin_viewer)) -> Response:
    return page(
        request,
        "live_panel.html",
        who,
        engines=_engines(request),
        upstreams=_upstreams(request),
        gateway=_gateway_figures(request),
    )


@router.get("/health")
async def health(request: Request, who: Viewer = Depends(admin_viewer)) -> Response:
    """``/health?deep=1``'s check, on demand: a real one-token call per model and upstream."""
    report = await deep_health(app_state(request).engines)
    return page(request, "live_health.html", who, report=report)
