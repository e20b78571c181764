"""``process_*`` series (memory, CPU seconds, open descriptors, start time): prometheus-client's
own process collector in one process; under ``serve --workers`` each worker's figures as gauges
labelled with its ``pid`` (prometheus-client's "liveall" mode), refreshed by a daemon thread, so
``/metrics`` shows every live worker apart (a sum of two workers' memory says little). A
replaced worker's series leave with it (``http/supervisor.py`` marks it dead)."""

from __future__ import annotations

import threading
import time

from prometheus_client import CollectorRegistry, Gauge, ProcessCollector

REFRESH_SECONDS = 5.0


def watch_process(registry: CollectorRegistry, *, per_worker: bool) -> None:
    if not per_worker:
        ProcessCollector(registry=registry)
        return
    series = WorkerProcessSeries(registry)
    series.refresh()  # at once: a scrape right after start-up sees them
    threading.Thread(target=series.run, name="process-gauges", daemon=True).start()


class WorkerProcessSeries:
    def __init__(self, registry: CollectorRegistry) -> None:
        self._source = ProcessCollector(registry=None)
        self._registry = registry
        self._gauges: dict[str, Gauge] = {}

    def refresh(self) -> None:
        for family in self._source.collect():
            for sample in family.samples:
                gauge = self._gauges.get(sample.name)
                if gauge is None:
                    gauge = self._gauges[sample.name] = Gauge(
                        sample.name, family.documentation, registry=self._registry, multiprocess_mode="liveall"
                    )
                gauge.set(sample.value)

    def run(self) -> None:
        while True:
            time.sleep(REFRESH_SECONDS)
            try:
                self.refresh()
            except OSError:
                continue  # /proc read while the process was busy: next round
