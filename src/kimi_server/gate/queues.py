"""The engines' admission queues and the figures they keep.

- ``AdmissionSet``: one fair queue per engine (``gate/admission.py``), and the prompt bounds of
  each engine's window; ``gate/admit.py`` takes a turn in it for every generation.
- ``tenant_engine_stats`` / ``server_totals``: what a key may see, and what only operators may.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kimi_server.engines.base import Engine
from kimi_server.gate.admission import Admission, AdmissionLimits
from kimi_server.policy.prompt_size import HOSTED_WINDOW, PromptLimits
from kimi_server.settings import Settings


class AdmissionSet:
    """One admission queue per engine (engines shared by several model ids share one)."""

    def __init__(self, engines: Iterable[Engine], settings: Settings) -> None:
        def limits(engine: Engine) -> AdmissionLimits:
            return AdmissionLimits(
                slots=engine.concurrency() or settings.parallel,
                max_queue=settings.queue_max,
                max_queue_per_key=settings.queue_max_per_key,
                max_wait=settings.queue_max_wait,
            )

        engines = list(engines)
        self._by_engine = {id(e): (e, Admission(limits(e))) for e in engines}
        self._prompt_limits = {
            id(e): PromptLimits.from_settings(settings, e.context_length() or HOSTED_WINDOW) for e in engines
        }

    def for_engine(self, engine: Engine) -> Admission:
        return self._by_engine[id(engine)][1]

    def prompt_limits(self, engine: Engine) -> PromptLimits:
        return self._prompt_limits[id(engine)]

    def items(self) -> list[tuple[Engine, Admission]]:
        return list(self._by_engine.values())


def tenant_engine_stats(queues: AdmissionSet, key_id: str) -> list[dict[str, Any]]:
    """Per engine, the caller's own figures only: its calls in flight and cancelled, its
    requests admitted, waiting and refused. Nothing here moves with another key's traffic."""
    rows = []
    for engine, admission in queues.items():
        rows.append({"engine": engine.name, **engine.tenant_stats(key_id), **admission.key_stats(key_id)})
    return rows


def server_totals(queues: AdmissionSet) -> list[dict[str, Any]]:
    """Server-wide figures per engine, for operators (``/metrics``), never for tenants: the
    engine's own totals (calls in flight and cancelled, ``cache_*``) and the queue's
    (``queue_*``: slots, admitted, waiting, refusals)."""
    return [
        {
            "engine": engine.name,
            **engine.stats(),
            **{f"queue_{name}": value for name, value in admission.totals().items()},
        }
        for engine, admission in queues.items()
    ]
