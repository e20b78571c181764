"""What a new user meets first: ``serve --help`` shows the defaults, the lines printed at start
are true (the docs link opens, or the line says a key is needed), and ``/openapi.json``
advertises the statuses the server really returns."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from kimi_server.cli import app as cli_app
from kimi_server.cli import start_lines
from kimi_server.settings import Settings
from tests.conftest import TEST_KEY, build_app, model_path


def test_serve_help_shows_the_defaults() -> None:
    result = CliRunner().invoke(cli_app, ["serve", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    defaults = Settings.model_fields
    for flag, name in (
        ("--host", "host"),
        ("--port", "port"),
        ("--model", "model"),
        ("--ctx-size", "ctx_size"),
        ("--parallel", "parallel"),
        ("--threads", "threads"),
    ):
        line = next(x for x in result.output.splitlines() if flag in x)
        assert f"[default: ({defaults[name].default})]" in line, line
    assert "development key" in result.output and "KIMI_MODELS_DIR" in result.output


def test_a_development_key_only_where_nothing_else_lets_anyone_in(tmp_path: Path) -> None:
    """The banner names a development key only for a server with no other key: beside an admin
    key or stored keys it would be one more key, with no limits, that nobody made."""
    from kimi_server.bootstrap import build_keys
    from kimi_server.gate.keys import KeyChanges, KeyStore
    from kimi_server.store.db import Database

    bare = Settings(data_dir=tmp_path / "bare")
    ring, dev = build_keys(bare)
    assert dev is not None and len(ring) == 1
    assert f"  development API key: {dev}" in start_lines(bare, ["kimi-k3"], dev)

    admin = Settings(data_dir=tmp_path / "admin", admin_key="sk-admin-first-run-0123456789")
    ring, dev = build_keys(admin)
    assert dev is None and len(ring) == 0 and not (tmp_path / "admin" / "dev-api-key").exists()
    assert not any("development" in line for line in start_lines(admin, ["kimi-k3"], dev))

    stored = Settings(data_dir=tmp_path / "stored")

    async def make_key() -> None:
        db = Database.from_settings(None, stored.data_dir)
        try:
            await db.migrate()
            await KeyStore(db).create("made-with-the-cli", KeyChanges())
        finally:
            await db.close()

    asyncio.run(make_key())
    ring, dev = build_keys(stored)
    assert dev is None and len(ring) == 0 and not (tmp_path / "stored" / "dev-api-key").exists()


def app_with(tmp_path: Path, **settings: Any) -> TestClient:
    return TestClient(build_app(tmp_path, **settings))


def test_printed_docs_line_is_true_with_the_default_settings(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    lines = start_lines(settings, ["kimi-k3"], "sk-kimi-dev")
    docs = next(x for x in lines if "docs:" in x)
    # The document needs a key by default: the page opens and asks for it, as the line says.
    assert docs == "  docs: http://127.0.0.1:8000/docs (asks for the API key)"
    with app_with(tmp_path) as c:
        assert c.get("/docs").status_code == 200
        assert c.get("/openapi.json").status_code == 401
        auth = {"Authorization": f"Bearer {TEST_KEY}"}
        assert c.get("/openapi.json", headers=auth).json()["info"]["title"] == "kimi-server"


def test_public_docs_open_in_a_browser(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, public_docs=True)
    lines = start_lines(settings, ["kimi-k3"], None)
    assert "  docs: http://127.0.0.1:8000/docs" in lines
    assert not any("development API key" in x for x in lines)
    with app_with(tmp_path, public_docs=True) as c:
        page = c.get("/docs")
        assert page.status_code == 200 and "/openapi.json" in page.text
        assert c.get("/openapi.json").status_code == 200


def test_openapi_advertises_the_statuses_the_server_returns(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    advertised = {
        (path, method): set(op["responses"]) for path, ops in schema["paths"].items() for method, op in ops.items()
    }
    generating = {"200", "400", "401", "404", "413", "429", "500", "503"}
    assert advertised[("/v1/chat/completions", "post")] == generating
    assert advertised[("/v1/responses", "post")] == generating
    assert advertised[("/v1/models", "get")] == {"200", "401"}
    assert advertised[("/v1/models/{model_id}", "get")] == {"200", "401", "404"}
    assert advertised[("/health", "get")] == {"200"}
    assert "HTTPValidationError" not in schema["components"]["schemas"]
    # What a 422 would have been is a 400 naming the field.
    bad = client.post("/v1/chat/completions", json={"model": "kimi-k3", "messages": "nope"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "messages"
    assert client.get("/v1/models/nope").status_code == 404
    for path, method in advertised:
        if path != "/health":
            call = client.post if method == "post" else client.get
            assert call(path.replace("{model_id}", "kimi-k3"), headers={"Authorization": ""}).status_code == 401


def test_model_paths_follow_the_servers_directory_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    mp = monkeypatch
    mp.setenv("KIMI_MODELS_DIR", "/srv/models")
    assert model_path("smollm2-135m").parent == Path("/srv/models")
    mp.delenv("KIMI_MODELS_DIR")
    mp.setenv("XDG_CACHE_HOME", "/srv/cache")
    assert model_path("smollm2-135m").parent == Path("/srv/cache/kimi-server/models")
