"""Gateway: stored keys, the admin API, auth on every route, request ids, no secret leaks.

Real SQLite, real HTTP (uvicorn on a socket), the scripted engine.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.routing import APIRoute
from typer.testing import CliRunner

from kimi_server.cli import app as cli_app
from tests.gateway_util import ADMIN_KEY, STATIC_KEY, chat_body, make_app, serve

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def api_routes(routes: list[Any]) -> Iterator[APIRoute]:
    """Every endpoint, including those of included routers."""
    for route in routes:
        if isinstance(route, APIRoute):
            yield route
        elif hasattr(route, "original_router"):
            yield from api_routes(route.original_router.routes)
        elif hasattr(route, "routes"):
            yield from api_routes(route.routes)
        else:
            raise AssertionError(f"a route the walk does not know: {route!r}")


def create_key(c: httpx.Client, **fields: object) -> tuple[str, str]:
    r = c.post("/admin/v1/keys", json=fields, headers=ADMIN)
    assert r.status_code == 200, r.text
    return r.json()["id"], r.json()["secret"]


def test_stored_key_lifecycle_through_admin_api(tmp_path: Path) -> None:
    app, _ = make_app(tmp_path)
    with serve(app) as url, httpx.Client(base_url=url) as c:
        key_id, secret = create_key(c, name="alice", rpm=100, budget_usd="2.50", allow_unpriced_budget=True)
        assert secret.startswith("sk-kimi-") and len(secret) >= len("sk-kimi-") + 43  # >= 256 bits
        assert c.post("/v1/chat/completions", json=chat_body(), headers=bearer(secret)).status_code == 200

        listed = c.get("/admin/v1/keys", headers=ADMIN).json()["data"]
        assert [k["name"] for k in listed] == ["alice"]
        assert "secret" not in listed[0] and secret not in json.dumps(listed)
        assert listed[0]["budget_usd"] == "2.5" and listed[0]["rpm"] == 100
        shown = c.get("/admin/v1/keys/alice", headers=ADMIN).json()
        assert shown["id"] == key_id
        changed = c.patch(f"/admin/v1/keys/{key_id}", json={"tpm": 5000, "clear": ["rpm"]}, headers=ADMIN).json()
        assert changed["rpm"] is None and changed["tpm"] == 5000

        assert c.delete(f"/admin/v1/keys/{key_id}", headers=ADMIN).json()["status"] == "revoked"
        time.sleep(1.0)  # the promise: refused within one second
        r = c.post("/v1/chat/completions", json=chat_body(), headers=bearer(secret))
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        # Static keys keep working beside stored ones.
        assert c.get("/v1/models", headers=bearer(STATIC_KEY)).status_code == 200
        # Bad admin input is a 400 naming the field, and duplicates are refused.
        r = c.post("/admin/v1/keys", json={"name": "x", "rpm": 0}, headers=ADMIN)
        assert r.status_code == 400 and r.json()["error"]["param"] == "rpm"
        r = c.post("/admin/v1/keys", json={"name": "alice"}, headers=ADMIN)
        assert r.status_code == 400 and r.json()["error"]["param"] == "name"
        assert c.get("/admin/v1/keys/nobody", headers=ADMIN).status_code == 404


def test_expired_key_is_refused(tmp_path: Path) -> None:
    app, _ = make_app(tmp_path)
    with serve(app) as url, httpx.Client(base_url=url) as c:
        key_id, secret = create_key(c, name="old", expires_at="2099-01-01T00:00:00Z")
        assert c.get("/v1/models", headers=bearer(secret)).status_code == 200
        # No one may set a past expiry; a key gets one by time passing, made here in the database.
        with sqlite3.connect(tmp_path / "data" / "kimi.db") as db:
            stored = db.execute("SELECT expires_at FROM api_keys WHERE id = ?", (key_id,)).fetchone()[0]
            past = stored.replace("2099", "2020")
            db.execute("UPDATE api_keys SET expires_at = ? WHERE id = ?", (past, key_id))
        time.sleep(1.0)  # the lookup cache holds a key for under a second
        assert c.get("/v1/models", headers=bearer(secret)).status_code == 401


def test_key_limited_to_models_sees_only_those(tmp_path: Path) -> None:
    app, _ = make_app(tmp_path)
    with serve(app) as url, httpx.Client(base_url=url) as c:
        _, secret = create_key(c, name="k3-only", models=["kimi-k3"])
        h = bearer(secret)
        assert [m["id"] for m in c.get("/v1/models", headers=h).json()["data"]] == ["kimi-k3"]
        assert c.get("/v1/models/kimi-k3.1-pro", headers=h).status_code == 404
        r = c.post("/v1/chat/completions", json=chat_body("kimi-k3.1-pro"), headers=h)
        assert r.status_code == 404 and r.json()["error"]["param"] == "model"
        r = c.post("/v1/responses", json={"model": "kimi-k3.1-pro", "input": "Hi"}, headers=h)
        assert r.status_code == 404
        assert c.post("/v1/chat/completions", json=chat_body("kimi-k3"), headers=h).status_code == 200


# Health, the OpenAPI page and its assets (the document itself needs a key), the console's
# sign-in page and its assets, and the front page that points to them.
KEYLESS_PAGES = {"/health", "/docs", "/docs/assets/{name}", "/"}
CONSOLE_KEYLESS = {"/console/login", "/console/static/{name}"}


def test_every_route_but_health_needs_a_key_and_admin_needs_the_admin_key(tmp_path: Path) -> None:
    app, _ = make_app(tmp_path)
    routes = list(api_routes(app.routes))
    assert any(r.path.startswith("/admin/") for r in routes) and any(r.path == "/metrics" for r in routes)
    with serve(app) as url, httpx.Client(base_url=url) as c:
        _, normal = create_key(c, name="normal")
        for route in routes:
            path = route.path.replace("{model_id}", "kimi-k3").replace("{key}", "normal")
            for method in route.methods or ():
                r = c.request(method, path, json={})
                if route.path.startswith("/console"):
                    # The console's own session decides: without one, the sign-in page, a redirect
                    # to it, its static assets, or a refusal; never a page with data.
                    assert r.status_code in (200, 303, 400, 401, 403, 404, 405), (method, path, r.status_code)
                    if r.status_code == 200:
                        assert route.path in CONSOLE_KEYLESS, (method, path)
                    continue
                if route.path in KEYLESS_PAGES:
                    # Static pages that hold no data (docs/configuration.md says which).
                    assert r.status_code in (200, 303, 404, 405), (method, path, r.status_code)
                    continue
                assert r.status_code == 401, (method, path, r.status_code)
                assert r.json()["error"]["type"] == "authentication_error"
                assert "x-request-id" in r.headers
                if route.path.startswith("/admin/"):
                    for key in (normal, STATIC_KEY):
                        r = c.request(method, path, json={}, headers=bearer(key))
                        assert r.status_code == 403, (method, path, r.status_code)
                        assert r.json()["error"]["type"] == "permission_error"


def test_admin_api_is_off_without_an_admin_key(tmp_path: Path) -> None:
    app, _ = make_app(tmp_path, admin_key=None)
    with serve(app) as url, httpx.Client(base_url=url) as c:
        r = c.get("/admin/v1/keys", headers=bearer(STATIC_KEY))
        assert r.status_code == 403 and "off" in r.json()["error"]["message"]
        assert c.get("/admin/v1/keys", headers=bearer("anything")).status_code == 403


def test_request_ids(tmp_path: Path) -> None:
    app, _ = make_app(tmp_path)
    with serve(app) as url, httpx.Client(base_url=url, headers=bearer(STATIC_KEY)) as c:
        own = c.get("/v1/models", headers={"x-request-id": "client-abc.123"})
        assert own.headers["x-request-id"] == "client-abc.123"
        made = c.get("/v1/models", headers={"x-request-id": "bad id\twith <stuff>"})
        assert made.headers["x-request-id"].startswith("req_")
        a, b = c.get("/health"), c.get("/health")
        assert a.headers["x-request-id"] != b.headers["x-request-id"]


def test_no_secret_in_database_dump_or_log(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    app, _ = make_app(tmp_path)
    prompt = "my-private-prompt-text-42"
    with serve(app) as url, httpx.Client(base_url=url) as c:
        _, secret = create_key(c, name="leaky?")
        body = {"model": "kimi-k3", "messages": [{"role": "user", "content": prompt}]}
        assert c.post("/v1/chat/completions", json=body, headers=bearer(secret)).status_code == 200
        assert c.post("/v1/chat/completions", json=body, headers=bearer(STATIC_KEY)).status_code == 200
        assert c.get("/v1/models", headers=bearer(secret + "x")).status_code == 401
    with sqlite3.connect(tmp_path / "data" / "kimi.db") as db:
        dump = "\n".join(db.iterdump())
    assert "INSERT INTO" in dump and "leaky?" in dump
    for secret_text in (secret, secret.removeprefix("sk-kimi-"), STATIC_KEY, ADMIN_KEY, prompt):
        assert secret_text not in dump
        assert secret_text not in caplog.text
    request_lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "kimi_server.requests"]
    chat_lines = [line for line in request_lines if line["path"] == "/v1/chat/completions"]
    assert len(chat_lines) == 2 and all(line["status"] == 200 and line["request_id"] for line in chat_lines)
    assert chat_lines[0]["completion_tokens"] == 4


def test_cli_keys_and_usage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KIMI_DATA_DIR", str(tmp_path / "data"))
    runner = CliRunner()
    made = runner.invoke(
        cli_app,
        [
            "keys",
            "create",
            "--name",
            "bob",
            "--rpm",
            "7",
            "--budget",
            "3",
            "--models",
            "kimi-k3",
            "--expires",
            "2099-01-01",
            "--allow-unpriced-budget",
        ],
    )
    assert made.exit_code == 0, made.output
    secret = next(line for line in made.stdout.splitlines() if line.startswith("sk-kimi-"))
    listed = runner.invoke(cli_app, ["keys", "list", "--json"])
    assert listed.exit_code == 0 and secret not in listed.stdout
    (row,) = json.loads(listed.stdout)
    assert (row["name"], row["rpm"], row["budget_usd"], row["models"]) == ("bob", 7, "3", ["kimi-k3"])
    assert runner.invoke(cli_app, ["keys", "update", "bob", "--clear", "rpm"]).exit_code == 0
    assert json.loads(runner.invoke(cli_app, ["keys", "show", "bob", "--json"]).stdout)[0]["rpm"] is None
    # The server sees the key the CLI made, and the CLI sees the server's ledger.
    app, _ = make_app(tmp_path)
    with serve(app) as url, httpx.Client(base_url=url) as c:
        assert c.post("/v1/chat/completions", json=chat_body(), headers=bearer(secret)).status_code == 200
    usage = runner.invoke(cli_app, ["usage", "--by", "key", "--json"])
    assert usage.exit_code == 0, usage.output
    (total,) = json.loads(usage.stdout)
    assert total["name"] == "bob" and total["requests"] == 1 and total["completion_tokens"] == 4
    assert runner.invoke(cli_app, ["keys", "revoke", "bob"]).exit_code == 0
    missing = runner.invoke(cli_app, ["keys", "show", "nobody"])
    assert missing.exit_code == 1 and "nobody" in missing.output
    assert runner.invoke(cli_app, ["keys", "create", "--name", "z", "--budget", "lots"]).exit_code != 0
