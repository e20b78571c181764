"""The engines' figures and their admission queues' (``gate/queues.py:server_totals``) as
Prometheus series: read at scrape time in one process; under ``serve --workers`` copied every
``REFRESH_SECONDS`` into multiprocess series, so that ``/metrics`` and the console's Live page
(which reads what ``/metrics`` reads) add up every worker.

Current figures (calls running, requests admitted and waiting, slots) are gauges summed over the
live workers; the queue's refusals are counters, each worker adding what it refused since its
last refresh, so a replaced worker's refusals still count.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

REFRESH_SECONDS = 1.0
# (engine name, its figures: engine.stats() and the queue's, as server_totals gives them)
EngineFigures = Callable[[], list[tuple[str, dict[str, Any]]]]

# name -> (help, the figure it shows)
GAUGES = {
    "kimi_engine_slots_busy": ("Generation calls running on an engine", "active_calls"),
    "kimi_engine_queued": ("Requests waiting for an engine slot", "queue_queued_requests"),
    "kimi_queue_admitted": ("Requests admitted to an engine and not yet done", "queue_admitted_requests"),
    "kimi_queue_slots": ("Requests an engine admits at once", "queue_slots"),
    "kimi_queue_max": ("Requests an engine's queue may hold waiting", "queue_queue_max"),
    # The embedded engine under cpu_poll auto (engines/llamacpp/wait_governor.py); 0 elsewhere.
    "kimi_engine_cpu_threads": ("Threads llama.cpp decodes on now, under cpu_poll auto", "cpu_threads"),
    "kimi_engine_cpu_spinning": ("1 while llama.cpp's waiting threads spin, under cpu_poll auto", "cpu_spinning"),
}
CACHE = ("kimi_engine_prompt_cache", "The engine's prompt-cache counters (hits, misses, writes, held)")
REFUSALS = ("kimi_queue_refusals", "Requests the engine's admission queue refused, by reason")
# reason label -> the queue's figure (gate/admission.py)
REFUSAL_FIGURES = {
    "queue_full": "queue_rejected_queue_full",  # 503: the queue was full
    "key_share": "queue_rejected_key_share",  # 429: the key held its share of the queue
    "timed_out": "queue_timed_out",  # 503: it waited queue_max_wait
    "predicted_wait": "queue_refused_early",  # 503 at once: its predicted wait was past queue_max_wait
}


def _cache_counters(figures: dict[str, Any]) -> Iterable[tuple[str, int]]:
    for key, value in figures.items():
        if key.startswith("cache_"):
            yield key.removeprefix("cache_"), int(value)


class EngineCollector(Collector):
    """Read at scrape time, in this process (one server process)."""

    def __init__(self, figures: EngineFigures) -> None:
        self._figures = figures

    def collect(self) -> Iterable[Metric]:
        gauges = {name: GaugeMetricFamily(name, text, labels=["engine"]) for name, (text, _) in GAUGES.items()}
        cache = GaugeMetricFamily(*CACHE, labels=["engine", "counter"])
        refusals = CounterMetricFamily(*REFUSALS, labels=["engine", "reason"])
        for engine, figures in self._figures():
            for name, (_, key) in GAUGES.items():
                gauges[name].add_metric([engine], figures.get(key, 0))
            for counter, value in _cache_counters(figures):
                cache.add_metric([engine, counter], value)
            for reason, key in REFUSAL_FIGURES.items():
                refusals.add_metric([engine, reason], figures.get(key, 0))
        yield from gauges.values()
        yield cache
        yield refusals


class EngineSeries:
    """The same series in multiprocess mode, refreshed by a daemon thread (reading a few
    counters; no lock is needed for that)."""

    def __init__(self, figures: EngineFigures, registry: CollectorRegistry) -> None:
        self._figures = figures
        self._gauges = {
            name: Gauge(name, text, ["engine"], registry=registry, multiprocess_mode="livesum")
            for name, (text, _) in GAUGES.items()
        }
        self._cache = Gauge(*CACHE, ["engine", "counter"], registry=registry, multiprocess_mode="livesum")
        self._refusals = Counter(*REFUSALS, ["engine", "reason"], registry=registry)
        self._counted: dict[tuple[str, str], int] = {}

    def start(self) -> None:
        threading.Thread(target=self._run, name="engine-gauges", daemon=True).start()

    def _run(self) -> None:
        while True:
            time.sleep(REFRESH_SECONDS)
            try:
                self.refresh()
            except RuntimeError:
                continue  # a counter changed size while read from this thread: next round

    def refresh(self) -> None:
        for engine, figures in self._figures():
            for name, (_, key) in GAUGES.items():
                self._gauges[name].labels(engine).set(figures.get(key, 0))
            for counter, value in _cache_counters(figures):
                self._cache.labels(engine, counter).set(value)
            for reason, key in REFUSAL_FIGURES.items():
                now = int(figures.get(key, 0))
                series = self._refusals.labels(engine, reason)  # shown at 0 before the first
                if now > self._counted.get((engine, reason), 0):
                    series.inc(now - self._counted.get((engine, reason), 0))
                self._counted[(engine, reason)] = now
