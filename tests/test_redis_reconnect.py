"""A Redis restart leaves the pooled connections stale: the next call is retried on a fresh
connection and the limits stay shared, instead of falling back to per-instance limits.

Runs its own redis-server on a free port (the machine's shared one is never restarted)."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import redis

from tests.gateway_util import ADMIN_KEY, chat_body, free_port, make_app, serve

REDIS_SERVER = shutil.which("redis-server")
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed"),
]
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
_running: dict[int, subprocess.Popen[bytes]] = {}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@contextmanager
def own_redis(port: int, restart: bool = False) -> Iterator[subprocess.Popen[bytes]]:
    """A redis-server of this test's own on ``port``; ``restart``: kill the running one (by its
    PID, kept in ``_running``) first, as a crash and restart would."""
    assert REDIS_SERVER is not None
    if restart:
        old = _running.pop(port)
        old.kill()
        old.wait(10)
    proc = subprocess.Popen(
        [
            REDIS_SERVER,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        client = redis.Redis(port=port)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.05)
        client.close()
        _running[port] = proc
        yield proc
    finally:
        _running.pop(port, None)
        proc.kill()
        proc.wait(10)


def test_a_stale_connection_after_a_redis_restart_is_retried_not_fallen_back(tmp_path: Path) -> None:
    """Through the real server: a request, Redis killed by PID and started again on its port,
    the next request: still admitted by the shared limits (the new Redis holds them), the
    server never degraded to per-instance limits."""
    port = free_port()
    app, _ = make_app(tmp_path, redis_url=f"redis://127.0.0.1:{port}/0", redis_prefix="kimi-test:")
    with own_redis(port), serve(app) as url, httpx.Client(base_url=url, timeout=30) as c:
        made = c.post("/admin/v1/keys", json={"name": "r", "rpm": 100}, headers=ADMIN).json()
        assert c.post("/v1/chat/completions", json=chat_body(), headers=bearer(made["secret"])).status_code == 200
        with own_redis(port, restart=True):
            r = c.post("/v1/chat/completions", json=chat_body(), headers=bearer(made["secret"]))
            assert r.status_code == 200
            # Counted in the new Redis: one request taken from a full bucket of 100.
            level = redis.Redis(port=port).hget(f"kimi-test:rl:{made['id']}", "r")
            assert level is not None and 98 < float(level) < 100
            metrics = c.get("/metrics", headers=ADMIN).text
    assert "kimi_ratelimit_degraded 0.0" in metrics
