"""Several server processes on one port: ``serve --workers N``.

uvicorn's supervisor starts N workers, each listening on the port with a socket of its own
(``PortPerWorker``), each a fresh interpreter that builds its own app from the parent's
settings (written to a private 0600 file, named by an environment variable). What must hold
across workers is shared outside them:

- the database (keys, ledger): SQLite in WAL mode or PostgreSQL, migrated once by the parent
  before any worker starts; each worker sees a revoked key within ``key_cache_seconds`` as one
  process does;
- per-key limits: Redis when configured, else a memory-mapped file in the same private directory
  (``gate/shared_limits.py``), so RPM, TPM and budgets are exact across workers; the counts of
  failed authentications likewise (``gate/failure_counts_mapped.py``);
- ``/metrics``: prometheus-client's multiprocess mode, every worker's series summed (the
  console's Live page reads the same).

The parent (``http/supervisor.py``) gives a worker ``worker_start_timeout`` to start, then
``worker_health_timeout`` to answer each check, and logs why it replaced one.

The embedded engine runs in one process (its model is loaded once), so N > 1 is for servers
whose every model is relayed to upstreams.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from kimi_server.engines.llamacpp.engine import EmbeddedEngine
from kimi_server.heap import settle_heap
from kimi_server.serving.common import EngineSet
from kimi_server.settings import Settings

SETTINGS_ENV = "KIMISERVER_WORKER_SETTINGS"  # not KIMI_*: that prefix is for settings only
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
LIMITS_FILE = "limits.map"
AUTH_FAILURES_FILE = "auth-failures.map"


def uses_embedded(engines: EngineSet) -> bool:
    return any(isinstance(engine, EmbeddedEngine) for engine in engines.unique())


def uses_scripted(engines: EngineSet) -> bool:
    """The test suite's fake engine (``KIMI_TEST_ENGINE``): one process, like the embedded one."""
    from kimi_server.engines.scripted import ScriptedEngine

    return any(isinstance(engine, ScriptedEngine) for engine in engines.unique())


def usable_cores() -> int:
    """The cores this process may run on (a container's CPU set, not the host's count)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def worker_count(settings: Settings, engines: EngineSet) -> int:
    """``settings.workers``, or its default; raises ValueError for N > 1 with the embedded engine."""
    embedded = uses_embedded(engines)
    if settings.workers is None:
        return 1 if embedded or uses_scripted(engines) else usable_cores()
    if settings.workers > 1 and embedded:
        raise ValueError(
            "--workers above 1 needs every model relayed to upstreams: the embedded engine loads its "
            "model once, in one process"
        )
    return settings.workers


@contextmanager
def shared_state(settings: Settings) -> Iterator[Path]:
    """The private directory the workers share for one run: settings, limits, metrics."""
    with tempfile.TemporaryDirectory(prefix="kimi-workers-") as tmp:
        root = Path(tmp)
        descriptor = os.open(root / "settings.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as f:
            f.write(settings.model_dump_json())
        (root / "metrics").mkdir()
        os.environ[SETTINGS_ENV] = str(root / "settings.json")
        os.environ[MULTIPROC_ENV] = str(root / "metrics")
        try:
            yield root
        finally:
            os.environ.pop(SETTINGS_ENV, None)
            os.environ.pop(MULTIPROC_ENV, None)


def migrate_once(settings: Settings) -> None:
    """The schema brought up to date before the workers start, so they never race to do it."""
    if not settings.gateway_enabled:
        return
    from kimi_server.store.db import Database

    async def run() -> None:
        db = Database.from_settings(settings.database_url, settings.data_dir, settings.sqlite_synchronous)
        try:
            await db.migrate()
        finally:
            await db.close()

    asyncio.run(run())


@cache
def worker_settings() -> Settings:
    path = Path(os.environ[SETTINGS_ENV])
    data: dict[str, Any] = json.loads(path.read_text())
    return Settings(**data)


def app() -> FastAPI:
    """The uvicorn factory each worker calls."""
    from kimi_server.bootstrap import build_engines, build_keys
    from kimi_server.http.app import create_app

    settings = worker_settings()
    keys, _ = build_keys(settings)
    application = create_app(settings, build_engines(settings), keys)
    gateway = application.state.kimi.gateway
    if gateway is not None and not settings.redis_url:
        from kimi_server.gate.shared_limits import MappedLimiter

        gateway.limiter = MappedLimiter(Path(os.environ[SETTINGS_ENV]).parent / LIMITS_FILE)
    if not settings.redis_url:  # failed sign-ins counted alike by every worker
        from kimi_server.gate.failure_counts_mapped import MappedCounts

        throttle = application.state.kimi.throttle
        shared = Path(os.environ[SETTINGS_ENV]).parent / AUTH_FAILURES_FILE
        throttle.counts = MappedCounts(shared, throttle.limits.drain)
    settle_heap()
    return application


def __getattr__(name: str) -> Any:
    # uvicorn imports the HTTP protocol by name in each worker ("kimi_server.http.workers:Protocol");
    # it is built there, from the settings, with its connection limits.
    if name == "Protocol":
        from kimi_server.http.connections import uvicorn_options

        return uvicorn_options(worker_settings())["http"]
    raise AttributeError(name)


def run(settings: Settings, workers: int, options: dict[str, Any]) -> None:
    """Serves with ``workers`` processes; ``options``: uvicorn keyword arguments (no app)."""
    import uvicorn

    migrate_once(settings)
    arguments: dict[str, Any] = {
        **options,
        "factory": True,
        "workers": workers,
        "http": "kimi_server.http.workers:Protocol",
        # uvicorn's own wait for a replacement's start-up (a SIGHUP restart) takes the same time.
        "timeout_worker_healthcheck": settings.worker_start_timeout,
    }
    with shared_state(settings):
        config = uvicorn.Config("kimi_server.http.workers:app", **arguments)
        # One socket per worker where the system allows it; else one shared by all.
        reuse = hasattr(socket, "SO_REUSEPORT")
        listener = PortPerWorker.reserve(config.host, config.port, config.backlog) if reuse else config.bind_socket()
        try:
            supervisor(settings, config, [listener]).run()
        finally:
            listener.close()


def supervisor(settings: Settings, config: Any, sockets: list[socket.socket]) -> Any:
    """The parent's supervisor, with the settings' start-up and health-check times."""
    from kimi_server.http.supervisor import Supervisor

    return Supervisor(
        config, sockets, start_timeout=settings.worker_start_timeout, health_timeout=settings.worker_health_timeout
    )


class PortPerWorker(socket.socket):
    """The port, reserved in the supervisor (bound, never listening) and handed to each worker
    as a listening socket of its own (``SO_REUSEPORT``), so the kernel spreads new connections
    evenly over the workers. With one shared socket, the worker that wakes first accepts every
    connection waiting, and a keep-alive client stays with it: one worker busy, the rest idle.
    Pickled for a worker (uvicorn starts them with ``spawn``), it becomes that worker's socket."""

    host: str
    port: int
    backlog: int

    @classmethod
    def reserve(cls, host: str, port: int, backlog: int) -> PortPerWorker:
        sock = cls(_family(host), socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.host, sock.port, sock.backlog = host, port, backlog
        try:
            _reuse_port(sock).bind((host, port))
        except OSError as exc:
            sock.close()
            raise SystemExit(f"error: cannot listen on {host}:{port}: {exc.strerror}") from None
        return sock

    def __reduce__(self) -> tuple[Any, ...]:
        return (listen_in_worker, (self.host, self.port, self.backlog))


def listen_in_worker(host: str, port: int, backlog: int) -> socket.socket:
    # IPPROTO_TCP named, not left 0: asyncio turns Nagle's algorithm off only on connections
    # whose socket says TCP, and with it on, a response written in parts waits for the
    # client's delayed ACK (40 ms).
    sock = _reuse_port(socket.socket(_family(host), socket.SOCK_STREAM, socket.IPPROTO_TCP))
    sock.bind((host, port))
    sock.listen(backlog)
    return sock


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _reuse_port(sock: socket.socket) -> socket.socket:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    return sock
