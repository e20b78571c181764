"""The audit trail: every administrative action (keys and teams made, changed, rotated, revoked,
deleted; console sign-ins and failed sign-ins) with who, when, from where and what changed,
never a secret, from the admin API, the console and the command line; and the request log
line names who made each admin and console request.

Real SQLite, real HTTP (uvicorn on a socket), the scripted engine.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from kimi_server.cli import app as cli_app
from kimi_server.gate.key_hash import key_id_of
from tests.gateway_util import ADMIN_KEY, STATIC_KEY, make_app, serve

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
_CSRF = re.compile(r'name="csrf" value="([^"]+)"')


def admin(c: httpx.Client, method: str, path: str, **body: Any) -> Any:
    r = c.request(method, f"/admin/v1{path}", json=body or None, headers=ADMIN)
    assert r.status_code == 200, r.text
    return r.json()


def trail(c: httpx.Client, query: str = "") -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = admin(c, "GET", f"/audit{query}")["data"]
    return entries


def sign_in(c: httpx.Client, key: str) -> httpx.Response:
    token = _CSRF.search(c.get("/console/login").text)
    assert token is not None
    return c.post("/console/login", data={"csrf": token.group(1), "key": key})


def test_admin_api_actions_are_recorded_without_secrets(tmp_path: Path) -> None:
    app, _ = make_app(tmp_path)
    with serve(app) as url, httpx.Client(base_url=url) as c:
        team = admin(c, "POST", "/teams", name="ops", rpm=10)
        made = admin(c, "POST", "/keys", name="svc", rpm=50, team="ops", tags=["prod"])
        admin(c, "PATCH", "/keys/svc", rpm=60, clear=["tags"])
        rotated = admin(c, "POST", "/keys/svc/rotate", grace_seconds=30)
        admin(c, "DELETE", "/keys/svc")
        admin(c, "PATCH", "/teams/ops", tpm=1000)
        admin(c, "DELETE", "/teams/ops")
        entries = trail(c)
    assert [e["action"] for e in entries] == [
        "team.delete",
        "team.update",
        "key.revoke",
        "key.rotate",
        "key.update",
        "key.create",
        "team.create",
    ]
    assert {(e["surface"], e["who"], e["address"]) for e in entries} == {("admin_api", "admin key", "127.0.0.1")}
    by_action = {e["action"]: e for e in entries}
    assert by_action["key.create"]["target"] == made["id"]
    created = by_action["key.create"]["details"]
    assert (created["name"], created["rpm"], created["team"], created["tags"]) == ("svc", 50, "ops", ["prod"])
    assert by_action["key.update"]["details"] == {"rpm": [50, 60], "tags": [["prod"], []]}
    assert by_action["key.rotate"]["details"]["grace_seconds"] == 30
    assert (
        by_action["team.update"]["details"] == {"tpm": [None, 1000]}
        and by_action["team.delete"]["target"] == team["id"]
    )
    everything = json.dumps(entries)
    assert made["secret"] not in everything and rotated["secret"] not in everything and ADMIN_KEY not in everything
    assert "digest" not in everything
    # Filters: a family of actions, one key.
    with serve(make_app(tmp_path)[0]) as url, httpx.Client(base_url=url) as c:
        assert [e["action"] for e in trail(c, "?action=team")] == ["team.delete", "team.update", "team.create"]
        assert len(trail(c, f"?target={made['id']}")) == 4
        assert trail(c, "?since=2099-01-01T00:00:00Z") == []
        r = c.get("/admin/v1/audit?action=%00", headers=ADMIN)
        assert r.status_code == 400 and r.json()["error"]["param"] == "action"


def test_console_sign_ins_and_changes_are_recorded_as_the_session(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    app, _ = make_app(tmp_path)
    caplog.set_level(logging.INFO, logger="kimi_server.requests")
    with serve(app) as url, httpx.Client(base_url=url) as c:
        assert sign_in(c, "sk-not-a-key").status_code == 401
        assert sign_in(c, ADMIN_KEY).status_code == 303
        csrf = _CSRF.search(c.get("/console/keys").text)
        assert csrf is not None
        r = c.post("/console/keys", data={"csrf": csrf.group(1), "name": "from-console", "rpm": "5"})
        key_id = re.search(r'id="new-key-id">([^<]+)<', r.text)
        assert r.status_code == 200 and key_id is not None
        r = c.post(
            f"/console/keys/{key_id.group(1)}", data={"csrf": csrf.group(1), "action": "rotate", "grace_seconds": "60"}
        )
        assert r.status_code == 200 and "Key rotated" in r.text and 'id="grace-ends"' in r.text
        page = c.get(f"/console/audit?target={key_id.group(1)}")
        assert page.status_code == 200 and "key.rotate" in page.text and "console session (admin key)" in page.text
        with httpx.Client(base_url=url) as tenant:  # a tenant key signs in too, and is named by its id
            assert sign_in(tenant, STATIC_KEY).status_code == 303
        entries = trail(c, "?action=console")
        key_entries = trail(c, f"?target={key_id.group(1)}")
    assert [(e["action"], e["who"]) for e in entries] == [
        ("console.sign_in", f"console session (key {key_id_of(STATIC_KEY)})"),
        ("console.sign_in", "console session (admin key)"),
        ("console.sign_in_failed", "unknown key"),
    ]
    assert "sk-" not in json.dumps(entries)  # neither the wrong key nor a right one
    assert [(e["action"], e["surface"], e["who"]) for e in key_entries] == [
        ("key.rotate", "console", "console session (admin key)"),
        ("key.create", "console", "console session (admin key)"),
    ]
    assert all(e["address"] == "127.0.0.1" for e in entries + key_entries)
    # The request log line names who made each console and admin request.
    lines = [json.loads(str(r.msg)) for r in caplog.records if r.name == "kimi_server.requests"]
    console_posts = [line for line in lines if line["path"].startswith("/console/keys") and line["method"] == "POST"]
    assert console_posts and all(line["key_id"] == "admin" for line in console_posts)
    sign_ins = [
        (line["status"], line["key_id"])
        for line in lines
        if line["path"] == "/console/login" and line["method"] == "POST"
    ]
    assert sign_ins == [(401, None), (303, "admin"), (303, key_id_of(STATIC_KEY))]
    assert all(line["key_id"] == "admin" for line in lines if line["path"].startswith("/admin/"))


def test_command_line_changes_are_recorded_and_listed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KIMI_DATA_DIR", str(tmp_path / "data"))
    runner = CliRunner()
    for args in (
        ["teams", "create", "--name", "nightly", "--rpm", "3"],
        ["keys", "create", "--name", "job", "--team", "nightly", "--tags", "batch,cron"],
        ["keys", "rotate", "job"],
        ["teams", "update", "nightly", "--clear", "rpm"],
    ):
        result = runner.invoke(cli_app, args)
        assert result.exit_code == 0, (args, result.output)
    listed = json.loads(runner.invoke(cli_app, ["audit", "--json"]).stdout)
    assert [e["action"] for e in listed] == ["team.update", "key.rotate", "key.create", "team.create"]
    assert {(e["surface"], e["address"]) for e in listed} == {("cli", "local")}
    assert all(e["who"].startswith("command line (") for e in listed)
    assert listed[2]["details"]["tags"] == ["batch", "cron"] and listed[0]["details"] == {"rpm": [3, None]}
    plain = runner.invoke(cli_app, ["audit", "--action", "key.create"]).stdout.splitlines()
    assert plain[0].split("\t")[:3] == ["at", "action", "target"] and len(plain) == 2 and "key.create" in plain[1]
