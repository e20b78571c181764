"""Helpers for the gateway tests: an app on a real socket in a thread, and the services.

PostgreSQL (127.0.0.1:5432, database ``test``) and Redis (127.0.0.1:6379) run here and in CI.
A test that needs one fails when it is unreachable under ``CI=true`` and skips otherwise.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI

from kimi_server.engines.scripted import ScriptedEngine
from tests.conftest import build_app, require_mark

PG_ADMIN_URL = os.environ.get("KIMI_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("KIMI_TEST_REDIS", "redis://127.0.0.1:6379/0")
STATIC_KEY = "sk-static-test"
ADMIN_KEY = "sk-admin-test"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _reachable(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def need_service(name: str, port: int) -> None:
    if _reachable(port):
        return
    message = f"{name} is not reachable on 127.0.0.1:{port}"
    if os.environ.get("CI") == "true":
        pytest.fail(message + " (CI must run it: see .ci/run)")
    pytest.skip(message)


@contextmanager
def postgres_database() -> Iterator[str]:
    """A fresh, empty database on the local PostgreSQL; its SQLAlchemy URL. Dropped after."""
    require_mark("integration", "needs PostgreSQL")
    need_service("PostgreSQL", 5432)
    import asyncpg

    name = "kimi_gw_" + secrets.token_hex(6)

    async def admin(sql: str) -> None:
        conn = await asyncpg.connect(PG_ADMIN_URL)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(admin(f"CREATE DATABASE {name}"))
    try:
        yield PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name
    finally:
        asyncio.run(admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))


def redis_prefix() -> str:
    require_mark("integration", "needs Redis")
    need_service("Redis", 6379)
    return f"kimi-test-{secrets.token_hex(4)}:"


def make_app(tmp: Path, engine: ScriptedEngine | None = None, **settings: Any) -> tuple[FastAPI, ScriptedEngine]:
    engine = engine or ScriptedEngine()
    # The bursts here test the gateway's limits, not the overload queue (tests/test_overload.py).
    settings = {"admin_key": ADMIN_KEY, "queue_max": 1024, "queue_max_per_key": 1024, **settings}
    return build_app(tmp / "data", engine, keys=[STATIC_KEY], **settings), engine


@contextmanager
def serve(app: FastAPI) -> Iterator[str]:
    """The app on a real socket (uvicorn in a thread); its base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("test server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def chat_body(model: str = "kimi-k3", max_tokens: int | None = None, stream: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "stream": stream}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body
