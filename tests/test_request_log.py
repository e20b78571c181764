"""The request log: each request's timings, tokens, cost, finish reason and error from the
ledger, filtered through the admin API and ``kimi-server requests``; prompts and answers kept
only for keys or teams that capture them, never in the log, deleted after their retention.

Real SQLite, real HTTP (uvicorn on a socket), the scripted engine.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import sqlite3
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from kimi_server.cli import app as cli_app
from kimi_server.engines.scripted import Script, ScriptedEngine
from kimi_server.log_json import log_config
from tests.gateway_util import ADMIN_KEY, chat_body, make_app, serve

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
PRICES = {"kimi-k3": {"input": "100", "output": "100"}}
PROMPT = "The launch code is tangerine-42."


def admin(c: httpx.Client, method: str, path: str, **body: Any) -> Any:
    r = c.request(method, f"/admin/v1{path}", json=body or None, headers=ADMIN)
    assert r.status_code == 200, r.text
    return r.json()


def ask(c: httpx.Client, secret: str, **body: Any) -> httpx.Response:
    sent = {**chat_body(max_tokens=8), "messages": [{"role": "user", "content": PROMPT}], **body}
    return c.post("/v1/chat/completions", json=sent, headers={"Authorization": f"Bearer {secret}"})


def cli(tmp: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> str:
    monkeypatch.setenv("KIMI_DATA_DIR", str(tmp / "data"))
    result = CliRunner().invoke(cli_app, list(args))
    assert result.exit_code == 0, result.output
    return result.stdout


def test_each_request_is_listed_with_how_it_ended(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = ScriptedEngine()
    app, _ = make_app(tmp_path, engine, prices=PRICES)
    with serve(app) as url, httpx.Client(base_url=url) as c:
        web = admin(c, "POST", "/keys", name="web")
        batch = admin(c, "POST", "/keys", name="batch")
        assert ask(c, web["secret"]).status_code == 200
        assert ask(c, web["secret"], max_tokens=3).json()["choices"][0]["finish_reason"] == "length"
        engine.script = Script(fail_after=1)
        assert ask(c, batch["secret"]).status_code == 500
        engine.script = Script(delay=0.05)
        assert ask(c, batch["secret"]).status_code == 200

        rows = admin(c, "GET", "/requests")["data"]
        assert len(rows) == 4
        slowest, failed, cut, first = rows  # newest first
        assert (first["key_name"], first["status"], first["finish_reason"], first["error_code"]) == (
            "web",
            "completed",
            "stop",
            None,
        )
        assert first["prompt_tokens"] == 12 and first["completion_tokens"] == 4 and first["cost_usd"] == "0.0016"
        assert first["ttft_ms"] is not None and first["duration_ms"] >= first["ttft_ms"]
        assert cut["finish_reason"] == "length"
        assert (failed["status"], failed["finish_reason"], failed["error_code"]) == ("failed", None, "internal_error")

        by_key = admin(c, "GET", "/requests?key=web&status=completed")["data"]
        assert [r["request_id"] for r in by_key] == [cut["request_id"], first["request_id"]]
        assert [r["request_id"] for r in admin(c, "GET", "/requests?failed=true")["data"]] == [failed["request_id"]]
        # Slower than a threshold: every row over it, none under it.
        threshold = slowest["duration_ms"] - 0.001
        slow = admin(c, "GET", f"/requests?slow_ms={threshold}")["data"]
        assert slowest["request_id"] in {r["request_id"] for r in slow}
        assert {r["request_id"] for r in slow} == {r["request_id"] for r in rows if r["duration_ms"] > threshold}
        assert admin(c, "GET", "/requests?since=2099-01-01T00:00:00Z")["data"] == []
        assert admin(c, "GET", "/requests?until=2020-01-01T00:00:00Z")["data"] == []
        assert len(admin(c, "GET", "/requests?limit=1")["data"]) == 1
        shown = admin(c, "GET", f"/requests/{first['request_id']}")
        assert shown["request_id"] == first["request_id"] and shown["capture"] is None
        # Bad filters are 400s naming them.
        for query, param in (("status=done", "status"), ("limit=0", "limit"), ("since=tomorrow", "since")):
            r = c.get(f"/admin/v1/requests?{query}", headers=ADMIN)
            assert r.status_code == 400 and r.json()["error"]["param"] in (param, f"query.{param}"), r.text
        assert c.get("/admin/v1/requests/req_nope", headers=ADMIN).status_code == 404

    listed = json.loads(cli(tmp_path, monkeypatch, "requests", "--key", "web", "--status", "completed", "--json"))
    assert [r["request_id"] for r in listed] == [cut["request_id"], first["request_id"]]
    table = list(csv.DictReader(io.StringIO(cli(tmp_path, monkeypatch, "requests", "--failed", "--csv"))))
    assert [(r["request_id"], r["error_code"]) for r in table] == [(failed["request_id"], "internal_error")]
    one = json.loads(cli(tmp_path, monkeypatch, "requests", "--id", first["request_id"], "--json"))
    assert one["finish_reason"] == "stop" and one["capture"] is None
    lines = cli(tmp_path, monkeypatch, "requests", "--slow", str(threshold / 1000)).splitlines()
    assert any(slowest["request_id"] in line for line in lines[1:])


def test_prompts_and_answers_are_kept_only_where_asked_and_never_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    app, _ = make_app(tmp_path)
    caplog.set_level(logging.INFO)  # as the server logs by default
    caplog.set_level(logging.DEBUG, logger="kimi_server")  # and all of its own
    with serve(app) as url, httpx.Client(base_url=url) as c:
        admin(c, "POST", "/teams", name="audited", capture=True)
        kept = admin(c, "POST", "/keys", name="kept", capture=True)
        via_team = admin(c, "POST", "/keys", name="via-team", team="audited")
        plain = admin(c, "POST", "/keys", name="plain")
        for secret in (kept["secret"], via_team["secret"], plain["secret"]):
            assert ask(c, secret, stream=True, stream_options={"include_usage": True}).status_code == 200
        rows = {r["key_name"]: r for r in admin(c, "GET", "/requests")["data"]}
        shown = {name: admin(c, "GET", f"/requests/{rows[name]['request_id']}") for name in rows}

    for name in ("kept", "via-team"):
        capture = shown[name]["capture"]
        assert capture is not None, name
        assert capture["prompt"] == [{"role": "user", "text": PROMPT}]
        assert (capture["reasoning"], capture["answer"], capture["tool_calls"]) == ("Let me think.", "Hello there.", [])
    assert shown["plain"]["capture"] is None
    with sqlite3.connect(tmp_path / "data" / "kimi.db") as db:
        assert db.execute("SELECT count(*) FROM captures").fetchone()[0] == 2
    assert not [r for r in caplog.records if "tangerine" in r.getMessage()]
    # Even at debug, the database driver's lines (every statement's values) stay out.
    assert log_config("debug")["loggers"]["aiosqlite"]["level"] == "INFO"

    # Past the retention period, captures are deleted (at start, and hourly while serving).
    with sqlite3.connect(tmp_path / "data" / "kimi.db") as db:
        db.execute("UPDATE captures SET created_at = '2000-01-01 00:00:00.000000' WHERE key_id = ?", (kept["id"],))
    app, _ = make_app(tmp_path, capture_retention_days=7)
    with serve(app), sqlite3.connect(tmp_path / "data" / "kimi.db") as db:
        assert [k for (k,) in db.execute("SELECT key_id FROM captures")] == [via_team["id"]]


def test_tool_calls_and_images_are_captured_as_sent(tmp_path: Path) -> None:
    from kimi_server.engines.types import ToolCallDelta

    script = Script(
        content=(), tool_calls=(ToolCallDelta(0, "call_1", "lookup", '{"q":'), ToolCallDelta(0, None, None, '"x"}'))
    )
    app, _ = make_app(tmp_path, ScriptedEngine(script))
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
    with serve(app) as url, httpx.Client(base_url=url) as c:
        key = admin(c, "POST", "/keys", name="tools", capture=True)
        r = ask(c, key["secret"], tools=[tool])
        assert r.status_code == 200, r.text
        (row,) = admin(c, "GET", "/requests")["data"]
        assert row["finish_reason"] == "tool_calls"
        capture = admin(c, "GET", f"/requests/{row['request_id']}")["capture"]
    assert capture["tool_calls"] == [{"id": "call_1", "name": "lookup", "arguments": '{"q":"x"}'}]


def test_a_responses_request_is_captured_from_its_input_items(tmp_path: Path) -> None:
    app, _ = make_app(tmp_path)
    with serve(app) as url, httpx.Client(base_url=url) as c:
        key = admin(c, "POST", "/keys", name="responses", capture=True)
        sent = {"model": "kimi-k3", "instructions": "Be brief.", "input": PROMPT, "max_output_tokens": 8}
        r = c.post("/v1/responses", json=sent, headers={"Authorization": f"Bearer {key['secret']}"})
        assert r.status_code == 200, r.text
        (row,) = admin(c, "GET", "/requests")["data"]
        assert (row["endpoint"], row["finish_reason"]) == ("responses", "stop")
        capture = admin(c, "GET", f"/requests/{row['request_id']}")["capture"]
    assert [m["role"] for m in capture["prompt"]] == ["system", "user"]
    assert capture["prompt"][-1]["text"] == PROMPT and capture["answer"] == "Hello there."
