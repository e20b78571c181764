"""Key rotation: a new secret with the same id, limits, team and history; the old secret accepted
for the grace period only (the admin API and ``kimi-server keys rotate``).

Real SQLite, real HTTP (uvicorn on a socket), the scripted engine.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from kimi_server.cli import app as cli_app
from tests.gateway_util import ADMIN_KEY, chat_body, make_app, serve

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


def admin(c: httpx.Client, method: str, path: str, **body: Any) -> Any:
    r = c.request(method, f"/admin/v1{path}", json=body or None, headers=ADMIN)
    assert r.status_code == 200, r.text
    return r.json()


def status(c: httpx.Client, secret: str) -> int:
    return c.post("/v1/chat/completions", json=chat_body(), headers={"Authorization": f"Bearer {secret}"}).status_code


def until_refused(c: httpx.Client, secret: str, within: float) -> float:
    """Seconds until ``secret`` gets 401 (it must, within ``within``)."""
    started = time.monotonic()
    while status(c, secret) != 401:
        assert time.monotonic() - started < within, "the old secret is still accepted"
        time.sleep(0.05)
    return time.monotonic() - started


def test_a_rotated_key_keeps_its_id_limits_and_history(tmp_path: Path) -> None:
    app, _ = make_app(tmp_path)
    with serve(app) as url, httpx.Client(base_url=url) as c:
        made = admin(c, "POST", "/keys", name="svc", rpm=50, tags=["prod"])
        old = made["secret"]
        assert status(c, old) == 200
        rotated = admin(c, "POST", "/keys/svc/rotate", grace_seconds=600)
        new = rotated.pop("secret")
        assert new != old and new.startswith("sk-kimi-")
        assert (rotated["id"], rotated["rpm"], rotated["tags"]) == (made["id"], 50, ["prod"])
        assert rotated["previous_secret_expires_at"] is not None
        assert old not in json.dumps(admin(c, "GET", "/keys")) and new not in json.dumps(admin(c, "GET", "/keys"))
        # Both work during the grace period, as the same key.
        assert status(c, old) == 200 and status(c, new) == 200
        (row,) = admin(c, "GET", "/usage?by=key")["data"]
        assert row["key"] == made["id"] and row["requests"] == 3
        # Rotating again ends the earlier secret's grace at once; 0 s of grace ends this one's too.
        newest = admin(c, "POST", f"/keys/{made['id']}/rotate", grace_seconds=0)["secret"]
        until_refused(c, old, within=5)  # the lookup cache keeps a key for under a second
        until_refused(c, new, within=5)
        assert status(c, newest) == 200
        assert admin(c, "GET", "/keys/svc")["previous_secret_expires_at"] is None
        # Bad input is a 400 naming the field; a revoked key is not rotated.
        r = c.post("/admin/v1/keys/svc/rotate", json={"grace_seconds": -1}, headers=ADMIN)
        assert r.status_code == 400 and r.json()["error"]["param"] == "grace_seconds"
        admin(c, "DELETE", "/keys/svc")
        r = c.post("/admin/v1/keys/svc/rotate", json={}, headers=ADMIN)
        assert r.status_code == 400 and r.json()["error"]["param"] == "key"
        until_refused(c, newest, within=5)


def test_the_old_secret_is_refused_once_its_grace_ends(tmp_path: Path) -> None:
    app, _ = make_app(tmp_path)
    with serve(app) as url, httpx.Client(base_url=url) as c:
        old = admin(c, "POST", "/keys", name="short")["secret"]
        rotated = admin(c, "POST", "/keys/short/rotate", grace_seconds=2)
        ends = datetime.fromisoformat(rotated["previous_secret_expires_at"])
        assert status(c, old) == 200  # within the grace period
        until_refused(c, old, within=10)
        assert datetime.now(UTC) >= ends  # refused only once the grace period was over
        assert status(c, rotated["secret"]) == 200


def test_keys_rotate_prints_the_new_secret_alone_on_the_last_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KIMI_DATA_DIR", str(tmp_path / "data"))
    runner = CliRunner()
    made = runner.invoke(cli_app, ["keys", "create", "--name", "cli-key", "--rpm", "7"])
    assert made.exit_code == 0, made.output
    old = made.stdout.strip().splitlines()[-1]
    rotated = runner.invoke(cli_app, ["keys", "rotate", "cli-key", "--grace", "300"])
    assert rotated.exit_code == 0, rotated.output
    new = rotated.stdout.strip().splitlines()[-1]
    assert new.startswith("sk-kimi-") and new != old and rotated.stdout.strip() == new
    assert "accepted until" in rotated.stderr
    shown = json.loads(runner.invoke(cli_app, ["keys", "show", "cli-key", "--json"]).stdout)[0]
    assert shown["rpm"] == 7 and shown["previous_secret_expires_at"] is not None
    app, _ = make_app(tmp_path)
    with serve(app) as url, httpx.Client(base_url=url) as c:
        assert status(c, old) == 200 and status(c, new) == 200
    refused = runner.invoke(cli_app, ["keys", "rotate", "cli-key", "--grace", "-5"])
    assert refused.exit_code != 0 and "--grace" in refused.output
