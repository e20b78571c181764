"""Builds the engines and keys that settings describe (shared by the CLI and the test harness)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kimi_server.engines.base import Engine
from kimi_server.engines.llamacpp.embedded_config import EmbeddedConfig
from kimi_server.engines.llamacpp.engine import EmbeddedEngine
from kimi_server.engines.llamacpp.repetition import RepetitionLimits
from kimi_server.engines.upstream.build import upstream_engines
from kimi_server.gate.auth import KeyRing, development_key, key_id_of
from kimi_server.models.pull import resolve_model
from kimi_server.models.store import ModelStore, default_models_dir
from kimi_server.policy.catalogue import CATALOGUE
from kimi_server.serving.common import EngineSet
from kimi_server.settings import Settings


def cache_groups(settings: Settings) -> dict[str, str]:
    """Key id -> group name, for keys an operator opted into a shared cache namespace."""
    return {key_id_of(k): name for name, keys in settings.cache_groups.items() for k in keys}


# Test switches, read from the environment rather than settings (never for real use):
# KIMI_TEST_ENGINE=scripted serves the scripted fake engine instead of a model, its answers
# KIMI_TEST_ENGINE_TOKENS words long, one every KIMI_TEST_ENGINE_DELAY seconds.
TEST_ENGINE = "KIMI_TEST_ENGINE"
TEST_ENGINE_TOKENS = "KIMI_TEST_ENGINE_TOKENS"
TEST_ENGINE_DELAY = "KIMI_TEST_ENGINE_DELAY"


def build_engines(settings: Settings, environ: Mapping[str, str] = os.environ) -> EngineSet:
    if environ.get(TEST_ENGINE) == "scripted":  # test-only fake engine
        return scripted_engines(environ)
    # routed ids skip the embedded model; --upstream serves them all.
    upstream = upstream_engines(settings)
    if settings.upstream:
        return EngineSet(upstream)
    groups = cache_groups(settings)
    store = ModelStore(settings.models_dir or default_models_dir())
    by_path: dict[Path, Engine] = {}
    by_model: dict[str, Engine] = {}
    for spec in CATALOGUE:
        if spec.id in upstream:
            by_model[spec.id] = upstream[spec.id]
            continue
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
                    cpu_poll=settings.cpu_poll,
                    repetition=RepetitionLimits(
                        settings.repetition_max_ngram,
                        settings.repetition_min_repeats,
                        settings.repetition_min_tokens,
                    ),
                    reasoning_format=settings.reasoning_format,
                    temperature=settings.temperature,
                    top_p=settings.top_p,
                    verbose=settings.engine_verbose,
                    cache_entries=settings.cache_entries,
                    cache_max_tokens=settings.cache_max_tokens,
                    cache_enabled=settings.cache_enabled,
                    cache_ttl_scale=settings.cache_ttl_scale,
                    cache_groups=groups,
                    mmproj=settings.mmproj,
                    max_prompt_tokens=settings.max_prompt_tokens or None,
                    prefill_turn=settings.prefill_turn,
                    prefill_turn_shared=settings.prefill_turn_shared,
                    prefill_slowdown=settings.prefill_slowdown,
                    reasoning_together=settings.reasoning_together,
                    reasoning_together_seeded=settings.reasoning_together_seeded,
                )
            )
        by_model[spec.id] = by_path[path]
    return EngineSet(by_model)


def build_keys(settings: Settings) -> tuple[KeyRing, str | None]:
    """The key ring, plus the development key when the server has no other way in."""
    if settings.api_keys:
        return KeyRing(settings.api_keys), None
    if not wants_development_key(settings):
        return KeyRing([]), None
    dev = development_key(settings.data_dir)
    return KeyRing([dev]), dev


def wants_development_key(settings: Settings) -> bool:
    """Whether a development key is needed: no ``api_keys``, and no admin key or stored key to
    let anyone in. Beside those it would be one more key, with no limits, that the operator
    never made."""
    if not settings.gateway_enabled:
        return True
    return not settings.admin_key and not stored_keys_exist(settings)


def stored_keys_exist(settings: Settings) -> bool:
    """Whether the database holds a key that is not revoked (False before its first migration).
    Run on a thread of its own: ``serve --workers`` builds each worker's keys inside its loop."""
    from sqlalchemy import func, select
    from sqlalchemy.exc import SQLAlchemyError

    from kimi_server.store.db import Database
    from kimi_server.store.models import ApiKeyRow

    async def count() -> int:
        db = Database.from_settings(settings.database_url, settings.data_dir, settings.sqlite_synchronous)
        query = select(func.count()).select_from(ApiKeyRow).where(ApiKeyRow.revoked_at.is_(None))
        try:
            async with db.engine.connect() as conn:
                return int(await conn.scalar(query) or 0)
        except (SQLAlchemyError, OSError):
            return 0  # no table yet, or the database is down: start-up reports that itself
        finally:
            await db.close()

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, count()).result() > 0


def scripted_engines(environ: Mapping[str, str]) -> EngineSet:
    """Gateway, for tests and benchmarks only: every model served by the scripted
    engine, which needs no model file (``KIMI_TEST_ENGINE=scripted``)."""
    from kimi_server.engines.scripted import Script, ScriptedEngine

    tokens = min(max(int(environ.get(TEST_ENGINE_TOKENS, "2")), 1), 100_000)
    script = Script(
        reasoning=("Let me ", "think."),
        content=tuple(f"w{i} " for i in range(tokens)),
        delay=min(max(float(environ.get(TEST_ENGINE_DELAY, "0")), 0.0), 10.0),
    )
    engine = ScriptedEngine(script=script)
    return EngineSet({spec.id: engine for spec in CATALOGUE})
