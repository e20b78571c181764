"""Health of upstreams: breaker state, and with a probe, whether ``GET {base_url}/models``
answers (every OpenAI-compatible server has it) and how fast."""

from __future__ import annotations

import time
from typing import Any

import httpx

from kimi_server.engines.upstream.relay import Upstream


async def check_upstream(up: Upstream, timeout: float | None = None) -> dict[str, Any]:
    started = time.monotonic()
    report: dict[str, Any] = {"name": up.name, "dialect": up.cfg.dialect, "state": up.breaker.state}
    limit = timeout or up.cfg.connect_timeout
    try:
        resp = await up.client.get(f"{up.base}/models", headers=up.headers, timeout=limit)
        report["reachable"] = True
        report["ok"] = resp.status_code == 200
        report["status"] = resp.status_code
    except httpx.HTTPError as exc:
        report["reachable"] = False
        report["ok"] = False
        report["reason"] = type(exc).__name__
    report["latency_ms"] = round((time.monotonic() - started) * 1000, 1)
    return report
