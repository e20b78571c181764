"""``kimi_upstream_breaker_state``: each upstream's circuit breaker, one series per state, 1 for
the state it is in (so a dashboard shows which upstreams are being skipped).

Under ``serve --workers`` each worker has its own breakers: the gauge is summed over the live
workers, so it reads as the number of workers that see the upstream in that state.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

NAME = "kimi_upstream_breaker_state"
HELP = "Upstream circuit breakers: 1 for the state each is in (closed, open, half_open)"
STATES = ("closed", "open", "half_open")
REFRESH_SECONDS = 1.0
# (engine name, upstream name, breaker state) for every upstream of every engine.
UpstreamStates = Callable[[], list[tuple[str, str, str]]]


class _BreakerCollector(Collector):
    def __init__(self, states: UpstreamStates) -> None:
        self._states = states

    def collect(self) -> Iterable[GaugeMetricFamily]:
        family = GaugeMetricFamily(NAME, HELP, labels=["engine", "upstream", "state"])
        for engine, upstream, current in self._states():
            for state in STATES:
                family.add_metric([engine, upstream, state], 1 if state == current else 0)
        yield family


def breaker_states(engines: Iterable[object]) -> list[tuple[str, str, str]]:
    from kimi_server.engines.upstream.engine import UpstreamEngine

    return [
        (engine.name, up.name, up.breaker.state)
        for engine in engines
        if isinstance(engine, UpstreamEngine)
        for up in engine.upstreams
    ]


def watch_upstreams(registry: CollectorRegistry, states: UpstreamStates) -> None:
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry.register(_BreakerCollector(states))
        return
    gauge = Gauge(NAME, HELP, ["engine", "upstream", "state"], registry=registry, multiprocess_mode="livesum")

    def refresh() -> None:
        while True:
            time.sleep(REFRESH_SECONDS)
            for engine, upstream, current in states():
                for state in STATES:
                    gauge.labels(engine, upstream, state).set(1 if state == current else 0)

    threading.Thread(target=refresh, name="upstream-gauges", daemon=True).start()
