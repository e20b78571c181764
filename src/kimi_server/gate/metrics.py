"""Prometheus metrics, one registry per app (tests build many apps in one process).

Under ``serve --workers`` (``PROMETHEUS_MULTIPROC_DIR`` set) each worker writes its series to
files there and ``/metrics`` reads every worker's, whichever worker answers: counters and
histograms add up; gauges are the sum over live workers. The engine gauges, read from each
worker's engines, are copied into such gauges every ``ENGINE_REFRESH_SECONDS``.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar, cast

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from kimi_server.gate.upstream_metrics import UpstreamStates, watch_upstreams

disable_created_metrics()  # type: ignore[no-untyped-call]  # the *_created series only double the output
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
ENGINE_REFRESH_SECONDS = 1.0
EngineStats = Callable[[], list[tuple[str, dict[str, int]]]]
M = TypeVar("M", bound=MetricWrapperBase)


def multiprocess() -> bool:
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))


class _EngineCollector(Collector):
    """Engine slots busy and queued, read from ``engine.stats()`` at scrape time."""

    def __init__(self, stats: Callable[[], list[tuple[str, dict[str, int]]]]) -> None:
        self._stats = stats

    def collect(self) -> Iterable[GaugeMetricFamily]:
        busy = GaugeMetricFamily("kimi_engine_slots_busy", "Generation calls running on an engine", labels=["engine"])
        queued = GaugeMetricFamily("kimi_engine_queued", "Requests waiting for an engine slot", labels=["engine"])
        cache = GaugeMetricFamily(
            "kimi_engine_prompt_cache",
            "The engine's prompt-cache counters (hits, misses, writes, held)",
            labels=["engine", "counter"],
        )
        for name, stats in self._stats():
            busy.add_metric([name], stats.get("active_calls", 0))
            queued.add_metric([name], stats.get("queued", stats.get("queued_calls", 0)))
            for key, value in stats.items():
                if key.startswith("cache_"):
                    cache.add_metric([name, key.removeprefix("cache_")], value)
        yield busy
        yield queued
        yield cache


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "kimi_requests", "HTTP requests by model, endpoint and status", ["model", "endpoint", "status"], registry=r
        )
        self.latency = Histogram(
            "kimi_request_duration_seconds", "Request latency", ["endpoint"], buckets=LATENCY_BUCKETS, registry=r
        )
        self.ttft = Histogram(
            "kimi_time_to_first_token_seconds",
            "Time to the first generated token",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.tokens = Counter("kimi_tokens", "Tokens by class", ["model", "class"], registry=r)
        self.rejections = Counter("kimi_rejections", "Requests refused, by reason", ["reason"], registry=r)
        self.streams = Gauge(
            "kimi_streams_in_flight", "Streaming responses being sent", registry=r, multiprocess_mode="livesum"
        )
        self.cache_hits = Counter(
            "kimi_prompt_cache_hits", "Requests that reused a cached prompt prefix", ["model"], registry=r
        )
        self.degraded = Gauge(
            "kimi_ratelimit_degraded",
            "1 while the shared (Redis) limits are unreachable",
            registry=r,
            multiprocess_mode="livemax",
        )
        self.ledger_rows = Counter("kimi_ledger_rows", "Usage rows handed to the ledger", registry=r)
        # What the ledger rows cost at the configured prices (a float: dashboards, not accounting).
        self.spend = Counter("kimi_spend_usd", "Cost of the requests metered, in USD", ["model"], registry=r)
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}

    def child(self, metric: M, *labels: str) -> M:
        """``metric.labels(*labels)``, kept: each series is looked up once, not per request
        (the lookup validates and locks). Label values are ids this server serves, statuses,
        reasons: a bounded set."""
        key = (id(metric), labels)
        found = self._children.get(key)
        if found is None:
            if len(self._children) > 10_000:
                self._children.clear()
            found = self._children[key] = metric.labels(*labels)
        return cast(M, found)

    def watch_engines(self, stats: EngineStats) -> None:
        if multiprocess():
            _EngineGauges(stats, self.registry).start()
        else:
            self.registry.register(_EngineCollector(stats))

    def watch_upstreams(self, states: UpstreamStates) -> None:
        """Each upstream's breaker state, read at scrape time (``gate/upstream_metrics.py``)."""
        watch_upstreams(self.registry, states)

    def set_degraded(self, down: bool) -> None:
        self.degraded.set(1 if down else 0)

    def render(self) -> bytes:
        registry = self.registry
        if multiprocess():
            registry = CollectorRegistry()
            MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        out: Any = generate_latest(registry)
        return bytes(out)


class _EngineGauges:
    """The engine figures of ``_EngineCollector`` as gauges summed over the live workers,
    refreshed by a daemon thread (reading a few counters; no lock is needed for that)."""

    def __init__(self, stats: EngineStats, registry: CollectorRegistry) -> None:
        self._stats = stats
        self._busy = Gauge(
            "kimi_engine_slots_busy",
            "Generation calls running on an engine",
            ["engine"],
            registry=registry,
            multiprocess_mode="livesum",
        )
        self._queued = Gauge(
            "kimi_engine_queued",
            "Requests waiting for an engine slot",
            ["engine"],
            registry=registry,
            multiprocess_mode="livesum",
        )
        self._cache = Gauge(
            "kimi_engine_prompt_cache",
            "The engine's prompt-cache counters (hits, misses, writes, held)",
            ["engine", "counter"],
            registry=registry,
            multiprocess_mode="livesum",
        )

    def start(self) -> None:
        threading.Thread(target=self._run, name="engine-gauges", daemon=True).start()

    def _run(self) -> None:
        while True:
            time.sleep(ENGINE_REFRESH_SECONDS)
            try:
                self.refresh()
            except RuntimeError:
                continue  # a counter changed size while read from this thread: next round

    def refresh(self) -> None:
        for name, stats in self._stats():
            self._busy.labels(name).set(stats.get("active_calls", 0))
            self._queued.labels(name).set(stats.get("queued", stats.get("queued_calls", 0)))
            for key, value in stats.items():
                if key.startswith("cache_"):
                    self._cache.labels(name, key.removeprefix("cache_")).set(value)
