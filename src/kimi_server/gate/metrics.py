"""Prometheus metrics, one registry per app (tests build many apps in one process).

Under ``serve --workers`` (``PROMETHEUS_MULTIPROC_DIR`` set) each worker writes its series to
files there and ``/metrics`` reads every worker's, whichever worker answers: counters and
histograms add up; gauges are the sum over live workers. The engine figures, read from each
worker's engines, are copied into such series every second (``gate/engine_metrics.py``).
"""

from __future__ import annotations

import os
from typing import Any, TypeVar, cast

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.multiprocess import MultiProcessCollector

from kimi_server.gate.engine_metrics import EngineCollector, EngineFigures, EngineSeries
from kimi_server.gate.process_metrics import watch_process
from kimi_server.gate.upstream_metrics import UpstreamStates, watch_upstreams

disable_created_metrics()  # type: ignore[no-untyped-call]  # the *_created series only double the output
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
M = TypeVar("M", bound=MetricWrapperBase)


def multiprocess() -> bool:
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))


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
        # Stored keys expiring within key_expiry_alert_days (gate/operator_alerts.py); every
        # worker counts the same keys, so the workers' largest figure is the count.
        self.keys_expiring = Gauge(
            "kimi_keys_expiring_soon",
            "Stored keys that expire within key_expiry_alert_days",
            registry=r,
            multiprocess_mode="livemax",
        )
        # What the ledger rows cost at the configured prices (a float: dashboards, not accounting).
        self.spend = Counter("kimi_spend_usd", "Cost of the requests metered, in USD", ["model"], registry=r)
        # Failed authentications (gate/auth_throttle.py): by surface (api, admin, console), and
        # the locks they started, by what was locked (address, key_prefix).
        self.auth_failures = Counter(
            "kimi_auth_failures", "Keys presented and refused, by surface", ["surface"], registry=r
        )
        self.auth_throttled = Counter(
            "kimi_auth_throttled", "Authentications refused with 429 during a lock, by surface", ["surface"], registry=r
        )
        self.auth_lockouts = Counter(
            "kimi_auth_lockouts", "Locks started by repeated failed authentications", ["scope"], registry=r
        )
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        watch_process(r, per_worker=multiprocess())  # process_* (memory, CPU, descriptors)

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

    def watch_engines(self, figures: EngineFigures) -> None:
        """Each engine's figures and its queue's (``gate/engine_metrics.py``)."""
        if multiprocess():
            EngineSeries(figures, self.registry).start()
        else:
            self.registry.register(EngineCollector(figures))

    def watch_upstreams(self, states: UpstreamStates) -> None:
        """Each upstream's breaker state, read at scrape time (``gate/upstream_metrics.py``)."""
        watch_upstreams(self.registry, states)

    def set_degraded(self, down: bool) -> None:
        self.degraded.set(1 if down else 0)

    def collected(self) -> CollectorRegistry:
        """What ``/metrics`` shows: this registry, or under ``serve --workers`` every worker's
        series read from the shared directory (what the console's Live page reads too)."""
        if not multiprocess():
            return self.registry
        registry = CollectorRegistry()
        MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return registry

    def render(self) -> bytes:
        out: Any = generate_latest(self.collected())
        return bytes(out)
