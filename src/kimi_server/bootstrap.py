"""Builds the engines and keys that settings describe (shared by the CLI and the test harness)."""

from __future__ import annotations

from pathlib import Path

from kimi_server.engines.base import Engine
from kimi_server.engines.llamacpp.engine import EmbeddedConfig, EmbeddedEngine
from kimi_server.gate.auth import KeyRing, development_key
from kimi_server.models.pull import resolve_model
from kimi_server.models.store import ModelStore, default_models_dir
from kimi_server.policy.catalogue import CATALOGUE
from kimi_server.serving.common import EngineSet
from kimi_server.settings import Settings


def build_engines(settings: Settings) -> EngineSet:
    store = ModelStore(settings.models_dir or default_models_dir())
    by_path: dict[Path, Engine] = {}
    by_model: dict[str, Engine] = {}
    for spec in CATALOGUE:
        route = settings.routes.get(spec.id)
        name = (route.model if route and route.model else None) or settings.model
        path = resolve_model(name, store, auto_pull=settings.auto_pull).resolve()
        if path not in by_path:
            by_path[path] = EmbeddedEngine(
                EmbeddedConfig(
                    model_path=path,
                    n_ctx=settings.ctx_size,
                    n_parallel=settings.parallel,
                    n_threads=settings.threads,
                    reasoning_format=settings.reasoning_format,
                    temperature=settings.temperature,
                    top_p=settings.top_p,
                    verbose=settings.engine_verbose,
                )
            )
        by_model[spec.id] = by_path[path]
    return EngineSet(by_model)


def build_keys(settings: Settings) -> tuple[KeyRing, str | None]:
    """The key ring, plus the development key when no keys were configured."""
    if settings.api_keys:
        return KeyRing(settings.api_keys), None
    dev = development_key(settings.data_dir)
    return KeyRing([dev]), dev
