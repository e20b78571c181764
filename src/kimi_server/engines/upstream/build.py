"""Upstream engines from settings: the routes with ``engine = "upstream"``, or every model id
when ``serve --upstream URL`` names one server."""

from __future__ import annotations

import logging

from kimi_server.engines.base import Engine
from kimi_server.engines.upstream.clients import ClientSet
from kimi_server.engines.upstream.engine import UpstreamEngine
from kimi_server.engines.upstream.relay import Upstream
from kimi_server.policy.catalogue import CATALOGUE
from kimi_server.settings import Settings, UpstreamConfig


def single_upstream(settings: Settings) -> UpstreamConfig | None:
    if not settings.upstream:
        return None
    return UpstreamConfig(
        base_url=settings.upstream,
        dialect=settings.upstream_dialect,
        model=settings.upstream_model,
        api_key_env=settings.upstream_api_key_env,
        transport=settings.upstream_transport,
    )


def upstream_engines(settings: Settings) -> dict[str, Engine]:
    """Public model id -> its upstream engine. Upstreams at one base URL share their connections."""
    # httpx logs every request at INFO: a log line per relayed call is noise and costs time.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    pools: dict[str, ClientSet] = {}

    def make(cfg: UpstreamConfig) -> Upstream:
        client = pools.get(cfg.base_url)
        if client is None:
            client = pools[cfg.base_url] = ClientSet(cfg.max_connections)
        return Upstream(cfg, client)

    single = single_upstream(settings)
    if single is not None:
        engine = UpstreamEngine([make(single)], name=f"upstream:{single.dialect}")
        return {spec.id: engine for spec in CATALOGUE}
    out: dict[str, Engine] = {}
    for model_id, route in settings.routes.items():
        if route.engine == "upstream":
            out[model_id] = UpstreamEngine([make(c) for c in route.upstreams], name=f"upstream:{model_id}")
    return out
