"""Gateway on PostgreSQL and Redis (both run here and in CI; see tests/gateway_util.py).

Two real server processes share one database and one Redis: one key's RPM limit holds across
both, and a key revoked through one is refused by the other within a second.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import start_server, stop_server
from tests.gateway_util import (
    ADMIN_KEY,
    REDIS_URL,
    chat_body,
    free_port,
    make_app,
    postgres_database,
    redis_prefix,
    serve,
)

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.mark.integration
def test_postgres_store_keys_and_ledger(tmp_path: Path) -> None:
    with postgres_database() as db_url:
        app, _ = make_app(tmp_path, database_url=db_url)
        with serve(app) as url, httpx.Client(base_url=url) as c:
            made = c.post("/admin/v1/keys", json={"name": "pg", "rpm": 50}, headers=ADMIN).json()
            r = c.post("/v1/chat/completions", json=chat_body(), headers=bearer(made["secret"]))
            assert r.status_code == 200
            usage = c.get("/admin/v1/usage", params={"by": "key"}, headers=ADMIN).json()["data"]
            assert usage == [
                {
                    "key": made["id"],
                    "name": "pg",
                    "requests": 1,
                    "prompt_tokens": 12,
                    "cached_tokens": 0,
                    "cache_write_tokens": 0,
                    "reasoning_tokens": 2,
                    "completion_tokens": 4,
                    "web_search_calls": 0,
                    "server_counted_requests": 0,
                    "server_estimated_requests": 0,
                    "cost_usd": "0",
                }
            ]
            by_day = c.get("/admin/v1/usage", params={"by": "day"}, headers=ADMIN).json()["data"]
            assert len(by_day) == 1 and len(by_day[0]["day"]) == 10
        # A second start on the same database migrates nothing and keeps every row.
        app, _ = make_app(tmp_path, database_url=db_url)
        with serve(app) as url, httpx.Client(base_url=url) as c:
            assert c.get("/admin/v1/keys/pg", headers=ADMIN).json()["id"] == made["id"]
            assert c.get("/v1/models", headers=bearer(made["secret"])).status_code == 200


@pytest.mark.integration
def test_redis_limits_are_shared_by_two_apps(tmp_path: Path) -> None:
    prefix = redis_prefix()
    with postgres_database() as db_url:
        shared: dict[str, Any] = {"database_url": db_url, "redis_url": REDIS_URL, "redis_prefix": prefix}
        a, _ = make_app(tmp_path / "a", **shared)
        b, _ = make_app(tmp_path / "b", **shared)
        with serve(a) as url_a, serve(b) as url_b:
            made = httpx.post(url_a + "/admin/v1/keys", json={"name": "shared", "tpm": 200}, headers=ADMIN).json()

            async def burst() -> list[httpx.Response]:
                async with httpx.AsyncClient(headers=bearer(made["secret"]), timeout=30) as c:
                    calls = [
                        c.post(u + "/v1/chat/completions", json=chat_body(max_tokens=10)) for u in (url_a, url_b) * 40
                    ]
                    return await asyncio.gather(*calls)

            started = time.monotonic()
            responses = asyncio.run(burst())
            elapsed = time.monotonic() - started
    ok = [r for r in responses if r.status_code == 200]
    assert all(r.status_code in (200, 429) for r in responses)
    accepted = sum(r.json()["usage"]["total_tokens"] for r in ok)
    # Together the two instances stay within one limit (plus one reservation and the refill).
    assert 0 < accepted <= 200 + 34 + elapsed * 200 / 60


def test_redis_outage_falls_back_to_per_instance_limits(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    dead = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens here
    app, _ = make_app(tmp_path, redis_url=dead)
    with serve(app) as url, httpx.Client(base_url=url) as c:
        secret = c.post("/admin/v1/keys", json={"name": "r", "rpm": 2}, headers=ADMIN).json()["secret"]
        codes = [c.post("/v1/chat/completions", json=chat_body(), headers=bearer(secret)).status_code for _ in range(3)]
        metrics = c.get("/metrics", headers=ADMIN).text
    assert codes == [200, 200, 429]
    assert "kimi_ratelimit_degraded 1.0" in metrics
    assert sum("rate limits are per instance" in r.getMessage() for r in caplog.records) == 1


def _cli(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "kimi_server.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout


@pytest.mark.integration
@pytest.mark.e2e
def test_two_server_processes_enforce_one_rpm_limit(tmp_path: Path) -> None:
    prefix = redis_prefix()
    with postgres_database() as db_url:
        env = {
            "KIMI_TEST_ENGINE": "scripted",
            "KIMI_DATABASE_URL": db_url,
            "KIMI_REDIS_URL": REDIS_URL,
            "KIMI_REDIS_PREFIX": prefix,
            "KIMI_ADMIN_KEY": ADMIN_KEY,
        }
        cli_env = {**os.environ, **env, "KIMI_DATA_DIR": str(tmp_path / "cli")}
        secret = _cli(cli_env, "keys", "create", "--name", "team", "--rpm", "3").strip().splitlines()[-1]
        assert secret.startswith("sk-kimi-")
        (tmp_path / "a").mkdir()
        (tmp_path / "b").mkdir()
        proc_a, a = start_server(tmp_path / "a", env=env)
        try:
            proc_b, b = start_server(tmp_path / "b", env=env)
            try:
                started = time.monotonic()
                codes = []
                for i in range(10):
                    base = (a if i % 2 == 0 else b).base_url
                    r = httpx.post(base + "/chat/completions", json=chat_body(), headers=bearer(secret), timeout=30)
                    codes.append((i % 2, r.status_code))
                elapsed = time.monotonic() - started
                accepted = [s for s, code in codes if code == 200]
                assert all(code in (200, 429) for _, code in codes)
                # Alone, each would accept 3: together they accept 3 (plus what refilled meanwhile).
                assert 3 <= len(accepted) <= 3 + int(elapsed * 3 / 60)
                # Revoked through one instance: refused by the other within a second.
                root_a = a.base_url.removesuffix("/v1")
                assert httpx.delete(root_a + "/admin/v1/keys/team", headers=ADMIN).status_code == 200
                time.sleep(1.0)
                r = httpx.get(b.base_url + "/models", headers=bearer(secret))
                assert r.status_code == 401
                (usage,) = json.loads(_cli(cli_env, "usage", "--by", "key", "--json"))
                assert usage["name"] == "team" and usage["requests"] == len(accepted)
            finally:
                stop_server(proc_b)
        finally:
            stop_server(proc_a)
