"""Gateway: a server killed with SIGKILL under load loses no row of a completed request.

A request counts as completed when the client saw all of it (the whole JSON body, or the
stream's ``[DONE]``); the ledger row is committed before that last byte, so after a restart
each such request id is in the ledger exactly once and SQLite's integrity check passes.
"""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.conftest import start_server, stop_server
from tests.gateway_util import chat_body

pytestmark = pytest.mark.e2e

ENV = {"KIMI_TEST_ENGINE": "scripted", "KIMI_TEST_ENGINE_DELAY": "0.002", "KIMI_TEST_ENGINE_TOKENS": "20"}


async def _load(base_url: str, key: str, proc: subprocess.Popen[bytes]) -> set[str]:
    completed: set[str] = set()
    stop, enough = asyncio.Event(), asyncio.Event()

    def done(request_id: str) -> None:
        completed.add(request_id)
        if len(completed) >= 150:
            enough.set()

    async def worker(c: httpx.AsyncClient, n: int) -> None:
        while not stop.is_set():
            try:
                if n % 2:
                    r = await c.post("/chat/completions", json=chat_body())
                    if r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 22:
                        done(r.headers["x-request-id"])
                else:
                    async with c.stream("POST", "/chat/completions", json=chat_body(stream=True)) as r:
                        lines = [line async for line in r.aiter_lines()]
                        if r.status_code == 200 and "data: [DONE]" in lines:
                            done(r.headers["x-request-id"])
            except (httpx.HTTPError, ValueError):
                await asyncio.sleep(0.01)

    async with httpx.AsyncClient(base_url=base_url, headers={"Authorization": f"Bearer {key}"}, timeout=10) as c:
        tasks = [asyncio.create_task(worker(c, n)) for n in range(24)]
        await enough.wait()
        proc.send_signal(signal.SIGKILL)  # mid-load: many requests are in flight right now
        proc.wait()
        stop.set()
        await asyncio.gather(*tasks)
    return completed


def test_sigkill_under_load_keeps_every_completed_row(tmp_path: Path) -> None:
    proc, server = start_server(tmp_path, env=ENV)
    try:
        completed = asyncio.run(_load(server.base_url, server.key, proc))
    finally:
        if proc.poll() is None:
            proc.kill()
    assert len(completed) >= 150
    # Restart on the same data: migrations run again, nothing is lost or doubled.
    proc, server = start_server(tmp_path, env=ENV)
    r = httpx.post(
        server.base_url + "/chat/completions", json=chat_body(), headers={"Authorization": f"Bearer {server.key}"}
    )
    assert r.status_code == 200
    stop_server(proc)
    with sqlite3.connect(tmp_path / "data" / "kimi.db") as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        ids = [row[0] for row in db.execute("SELECT request_id FROM usage")]
        done = {row[0] for row in db.execute("SELECT request_id FROM usage WHERE status = 'completed'")}
    assert len(ids) == len(set(ids))
    assert completed <= done
    assert r.headers["x-request-id"] in done
