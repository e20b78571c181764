"""Admin input checked at the edge, spend safety, /metrics for operators only, private database
files, and key names printed safely.

Real HTTP (uvicorn on a socket), real SQLite and PostgreSQL (one fresh database per test),
the scripted engine.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from kimi_server.cli import app as cli_app
from kimi_server.gate import cli_common as gate_cli
from tests.gateway_util import ADMIN_KEY, STATIC_KEY, chat_body, make_app, postgres_database, serve

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
PAST = "2020-01-01T00:00:00Z"
FUTURE = "2099-01-01T00:00:00Z"
# Each admin input that once reached the database (and a 500) or was silently accepted, and the
# field its 400 must name.
BAD_CREATES: list[tuple[dict[str, Any], str]] = [
    ({"rpm": 10**30}, "rpm"),
    ({"rpm": 2**31}, "rpm"),  # past PostgreSQL's INTEGER
    ({"tpm": 2**63}, "tpm"),
    ({"tpm": 2**31}, "tpm"),
    ({"rpm": True}, "rpm"),
    ({"max_output_tokens": 2**31}, "max_output_tokens"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"budget_usd": "1e400"}, "budget_usd"),
    ({"budget_usd": "99999999999"}, "budget_usd"),  # past BIGINT nano-dollars
    ({"budget_usd": "0.0000000001"}, "budget_usd"),  # finer than a nano-dollar
    ({"budget_usd": "NaN"}, "budget_usd"),
    ({"name": "a\u0000b"}, "name"),
    ({"name": "red\u001b[31m"}, "name"),
    ({"name": "flip\u202eit"}, "name"),
    ({"name": "key_0123456789abcdef"}, "name"),  # a stored key's id
    ({"name": "0123456789abcdef"}, "name"),  # a static key's id
    ({"models": ["kimi-k3\u0000"]}, "models"),
    ({"models": ["kimi-k3,kimi-k3.1-pro"]}, "models"),  # one unknown id, never two models
    ({"models": ["kimi-k9"]}, "models"),
    ({"models": []}, "models"),
    ({"expires_at": PAST}, "expires_at"),
    ({"expires_at": "2099-01-01T00:00:00"}, "expires_at"),  # no time zone
    ({"expires_at": "9999-12-31T23:59:59-12:00"}, "expires_at"),  # past year 9999 in UTC
]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.integration)])
def backend(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """Settings for the store: SQLite under the test's data dir, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        yield {}
        return
    with postgres_database() as url:
        yield {"database_url": url}


def assert_400(r: httpx.Response, param: str) -> None:
    assert r.status_code == 400, (param, r.status_code, r.text)
    error = r.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error" and error["message"]


def test_each_bad_admin_input_is_a_400_naming_the_field(tmp_path: Path, backend: dict[str, Any]) -> None:
    app, _ = make_app(tmp_path, **backend)
    with serve(app) as url, httpx.Client(base_url=url, headers=ADMIN) as c:
        for fields, param in BAD_CREATES:
            assert_400(c.post("/admin/v1/keys", json={"name": "k", **fields}), param)
        assert c.post("/admin/v1/keys", json={"name": "ok"}).status_code == 200
        for fields, param in BAD_CREATES:
            if param != "name":
                assert_400(c.patch("/admin/v1/keys/ok", json=fields), param)
        for method in ("GET", "PATCH", "DELETE"):
            assert_400(c.request(method, "/admin/v1/keys/a%00b", json={}), "key")
        assert_400(c.get("/admin/v1/usage", params={"key": "x\u0000y"}), "key")
        assert_400(c.get("/admin/v1/usage", params={"since": "0001-01-01T00:00:00+14:00"}), "since")
        # Nothing bad was stored, and the key that was made is as it was.
        (only,) = c.get("/admin/v1/keys").json()["data"]
        assert (only["name"], only["rpm"], only["models"], only["expires_at"]) == ("ok", None, None, None)
        # The largest values the columns hold are accepted and kept exactly, on both databases.
        top = {
            "rpm": 2**31 - 1,
            "tpm": 2**31 - 1,
            "budget_usd": "9223372036.854775807",
            "allow_unpriced_budget": True,
            "models": ["kimi-k3"],
            "expires_at": FUTURE,
        }
        r = c.post("/admin/v1/keys", json={"name": "top", **top})
        assert r.status_code == 200, r.text
        shown = c.get("/admin/v1/keys/top").json()
        assert (shown["rpm"], shown["tpm"], shown["budget_usd"], shown["models"]) == (
            2**31 - 1,
            2**31 - 1,
            "9223372036.854775807",
            ["kimi-k3"],
        )


def test_models_may_name_configured_routes(tmp_path: Path) -> None:
    app, _ = make_app(tmp_path, routes={"house-model": {"model": "some.gguf"}})
    with serve(app) as url, httpx.Client(base_url=url, headers=ADMIN) as c:
        r = c.post("/admin/v1/keys", json={"name": "routed", "models": ["house-model", "kimi-k3"]})
        assert r.status_code == 200 and r.json()["models"] == ["house-model", "kimi-k3"]


def test_a_budget_needs_prices_for_every_model_of_the_key(
    tmp_path: Path, backend: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    priced = {"prices": {"kimi-k3": {"input": "1", "output": "2"}}, **backend}
    app, _ = make_app(tmp_path, **priced)
    with serve(app) as url, httpx.Client(base_url=url, headers=ADMIN) as c:
        # No model restriction: every served model, and two of them have no price.
        r = c.post("/admin/v1/keys", json={"name": "all", "budget_usd": "5"})
        assert_400(r, "budget_usd")
        assert r.json()["error"]["code"] == "unpriced_budget" and "kimi-k3.1-pro" in r.json()["error"]["message"]
        assert_400(
            c.post("/admin/v1/keys", json={"name": "pro", "budget_usd": "5", "models": ["kimi-k3.1-pro"]}), "budget_usd"
        )
        made = c.post("/admin/v1/keys", json={"name": "k3", "budget_usd": "10", "models": ["kimi-k3"]})
        assert made.status_code == 200, made.text
        assert made.json()["budget_usd"] == "10"  # as written, not "1E+1"
        # Widening a budgeted key to unpriced models is refused too, however it is done.
        assert_400(c.patch("/admin/v1/keys/k3", json={"clear": ["models"]}), "budget_usd")
        assert_400(c.patch("/admin/v1/keys/k3", json={"models": ["kimi-k3", "kimi-k3.1-pro"]}), "budget_usd")
        assert c.get("/admin/v1/keys/k3").json()["models"] == ["kimi-k3"]
        assert c.patch("/admin/v1/keys/k3", json={"rpm": 5}).status_code == 200  # spend untouched
        # Said explicitly, it is kept (and start-up names it).
        r = c.post("/admin/v1/keys", json={"name": "meant", "budget_usd": "5", "allow_unpriced_budget": True})
        assert r.status_code == 200, r.text
        meant_id = r.json()["id"]
    caplog.set_level(logging.WARNING, logger="kimi_server.gate.gateway")
    again, _ = make_app(tmp_path, **priced)
    with serve(again):
        pass
    warnings = [rec.getMessage() for rec in caplog.records if rec.name == "kimi_server.gate.gateway"]
    assert len(warnings) == 1 and meant_id in warnings[0] and "kimi-k3.1-pro" in warnings[0], warnings


def test_metrics_are_for_the_admin_key_only(tmp_path: Path) -> None:
    app, _ = make_app(tmp_path)
    with serve(app) as url, httpx.Client(base_url=url) as c:
        stored = c.post("/admin/v1/keys", json={"name": "tenant"}, headers=ADMIN).json()["secret"]
        assert c.post("/v1/chat/completions", json=chat_body(), headers=bearer(stored)).status_code == 200
        for tenant in (stored, STATIC_KEY, "sk-wrong"):
            r = c.get("/metrics", headers=bearer(tenant))
            assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
            assert "kimi_requests_total" not in r.text
        r = c.get("/metrics")
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        r = c.get("/metrics", headers=ADMIN)
        assert r.status_code == 200 and "kimi_requests_total" in r.text
    public, _ = make_app(tmp_path / "public", metrics_public=True)
    with serve(public) as url:
        assert httpx.get(url + "/metrics").status_code == 200


def test_database_files_are_owner_only(tmp_path: Path) -> None:
    data = tmp_path / "data"
    assert not data.exists()
    app, _ = make_app(tmp_path)
    with serve(app) as url, httpx.Client(base_url=url, headers=ADMIN) as c:
        assert c.post("/admin/v1/keys", json={"name": "x"}).status_code == 200
        files = {p.name: stat.S_IMODE(p.stat().st_mode) for p in data.iterdir() if p.name.startswith("kimi.db")}
    assert set(files) >= {"kimi.db", "kimi.db-wal", "kimi.db-shm"}, files
    assert all(mode == 0o600 for mode in files.values()), {k: oct(v) for k, v in files.items()}
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    # A database made readable by others before (0644) is made owner-only on start.
    os.chmod(data / "kimi.db", 0o644)
    again, _ = make_app(tmp_path)
    with serve(again):
        pass
    assert stat.S_IMODE((data / "kimi.db").stat().st_mode) == 0o600


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@contextmanager
def cli_env(tmp: Path, monkeypatch: pytest.MonkeyPatch, **env: str) -> Iterator[CliRunner]:
    monkeypatch.setenv("KIMI_DATA_DIR", str(tmp / "data"))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    yield CliRunner()


def test_cli_refuses_bad_key_input_naming_the_option(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with cli_env(tmp_path, monkeypatch, KIMI_PRICES='{"kimi-k3": {"input": "1"}}') as runner:
        cases = [
            (["--expires", "2020-01-01"], "--expires"),
            (["--models", "kimi-k9"], "--models"),
            (["--rpm", str(2**31)], "--rpm"),
            (["--budget", "1e400"], "--budget"),
            (["--budget", "5"], "--allow-unpriced-budget"),  # every model, two unpriced
            (["--budget", "5", "--models", "kimi-k3.1-pro"], "--allow-unpriced-budget"),
        ]
        for args, named in cases:
            r = runner.invoke(cli_app, ["keys", "create", "--name", "k", *args])
            assert r.exit_code != 0 and named in r.output, (args, r.output)
        r = runner.invoke(cli_app, ["keys", "create", "--name", "key_0123456789abcdef"])
        assert r.exit_code == 1 and "key id" in r.output
        made = runner.invoke(cli_app, ["keys", "create", "--name", "k", "--budget", "5", "--models", "kimi-k3"])
        assert made.exit_code == 0, made.output
        assert runner.invoke(cli_app, ["keys", "update", "k", "--clear", "models"]).exit_code == 1
        listed = json.loads(runner.invoke(cli_app, ["keys", "list", "--json"]).stdout)
        assert [(k["name"], k["models"]) for k in listed] == [("k", ["kimi-k3"])]
        r = runner.invoke(cli_app, ["usage", "--since", "yesterday"])
        assert r.exit_code != 0 and "--since" in r.output and "--expires" not in r.output


def test_cli_prints_control_characters_in_names_visibly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gate_cli.out, "width", 400)  # one table row per line, whatever the terminal
    with cli_env(tmp_path, monkeypatch) as runner:
        made = runner.invoke(cli_app, ["keys", "create", "--name", "plain"])
        assert made.exit_code == 0, made.output
        secret = made.stdout.strip().splitlines()[-1]
        key_id = json.loads(runner.invoke(cli_app, ["keys", "list", "--json"]).stdout)[0]["id"]
        # A name stored before names were checked: colours, a cursor move, a bidi override.
        hostile = "evil\x1b[31mRED\x1b[2J\u202egnp.exe\x07"
        with sqlite3.connect(tmp_path / "data" / "kimi.db") as db:
            db.execute("UPDATE api_keys SET name = ? WHERE name = 'plain'", (hostile,))
        app, _ = make_app(tmp_path)
        with serve(app) as url:
            assert httpx.post(url + "/v1/chat/completions", json=chat_body(), headers=bearer(secret)).status_code == 200
        outputs = {
            "list": runner.invoke(cli_app, ["keys", "list"]),
            "show": runner.invoke(cli_app, ["keys", "show", key_id]),
            "usage": runner.invoke(cli_app, ["usage", "--by", "key"]),
        }
        for command, r in outputs.items():
            assert r.exit_code == 0, (command, r.output)
            for raw in ("\x1b", "\u202e", "\x07"):
                assert raw not in r.output, (command, r.output)
            assert "\\x1b" in r.output and "\\u202e" in r.output, (command, r.output)
