"""Teams, key rotation, the audit trail and the request log on each store: SQLite, and a fresh
PostgreSQL database (integration). Real HTTP (uvicorn on a socket), the scripted engine."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.gateway_util import ADMIN_KEY, REDIS_URL, chat_body, make_app, postgres_database, redis_prefix, serve

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
PRICES = {"kimi-k3": {"input": "100", "output": "100"}}  # the scripted answer costs 0.0016 USD


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.integration)])
def backend(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    if request.param == "sqlite":
        yield {}
        return
    with postgres_database() as url:
        yield {"database_url": url}


def admin(c: httpx.Client, method: str, path: str, **body: Any) -> Any:
    r = c.request(method, f"/admin/v1{path}", json=body or None, headers=ADMIN)
    assert r.status_code == 200, r.text
    return r.json()


def ask(c: httpx.Client, secret: str) -> httpx.Response:
    return c.post("/v1/chat/completions", json=chat_body(max_tokens=8), headers={"Authorization": f"Bearer {secret}"})


def test_teams_rotation_and_the_audit_trail(tmp_path: Path, backend: dict[str, Any]) -> None:
    app, _ = make_app(tmp_path, prices=PRICES, **backend)
    with serve(app) as url, httpx.Client(base_url=url) as c:
        team = admin(c, "POST", "/teams", name="lab", budget_usd="0.001", budget_period="monthly", models=["kimi-k3"])
        first = admin(c, "POST", "/keys", name="first", team="lab")
        second = admin(c, "POST", "/keys", name="second", team="lab", tags=["eval"])

        # The team's budget is shared: the first key's spend stops the second.
        assert ask(c, first["secret"]).status_code == 200
        refused = ask(c, second["secret"])
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "insufficient_quota"
        assert "team's monthly budget" in refused.json()["error"]["message"]
        shown = admin(c, "GET", "/teams/lab")
        assert shown["spent_usd"] == shown["period_spent_usd"] == "0.0016"

        # Rotation: the old secret works within its grace period, then gets 401; the new one works.
        rotated = admin(c, "POST", "/keys/first/rotate", grace_seconds=2)
        ends = datetime.fromisoformat(rotated["previous_secret_expires_at"])
        admin(c, "PATCH", "/teams/lab", budget_usd="1")
        deadline = time.monotonic() + 10  # the lookup cache holds a key for under a second
        while (r := ask(c, first["secret"])).status_code == 429:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert r.status_code == 200, r.text  # the old secret, within its grace
        answered = 2
        while (status := ask(c, first["secret"]).status_code) != 401:
            assert status == 200 and time.monotonic() < deadline + 10, "the old secret is still accepted"
            answered += 1
            time.sleep(0.05)
        assert datetime.now(UTC) >= ends
        assert ask(c, rotated["secret"]).status_code == 200
        (row,) = admin(c, "GET", "/usage?by=team")["data"]
        assert (row["team"], row["requests"]) == (team["id"], answered + 1)  # one key's history, both secrets

        # The request log by team and tag; the audit trail of it all.
        logged = admin(c, "GET", "/requests?team=lab&status=completed")["data"]
        assert len(logged) == answered + 1 and {r["key_name"] for r in logged} == {"first"}
        assert all(r["finish_reason"] == "stop" and r["team"] == "lab" for r in logged)
        assert admin(c, "GET", "/requests?tag=eval")["data"] == []
        entries = admin(c, "GET", "/audit")["data"]
    assert [(e["action"], e["target"]) for e in entries] == [
        ("team.update", team["id"]),
        ("key.rotate", first["id"]),
        ("key.create", second["id"]),
        ("key.create", first["id"]),
        ("team.create", team["id"]),
    ]
    assert all(e["who"] == "admin key" and e["address"] == "127.0.0.1" for e in entries)
    assert entries[0]["details"] == {"budget_usd": ["0.001", "1"]}
    assert rotated["secret"] not in str(entries) and first["secret"] not in str(entries)


@pytest.mark.integration
def test_a_team_limit_holds_across_instances_through_redis(tmp_path: Path) -> None:
    prefix = redis_prefix()
    with postgres_database() as db_url:
        shared: dict[str, Any] = {"database_url": db_url, "redis_url": REDIS_URL, "redis_prefix": prefix}
        a, _ = make_app(tmp_path / "a", **shared)
        b, _ = make_app(tmp_path / "b", **shared)
        with (
            serve(a) as url_a,
            serve(b) as url_b,
            httpx.Client(base_url=url_a) as ca,
            httpx.Client(base_url=url_b) as cb,
        ):
            admin(ca, "POST", "/teams", name="pair", rpm=2)
            one = admin(ca, "POST", "/keys", name="one", team="pair")["secret"]
            two = admin(cb, "POST", "/keys", name="two", team="pair")["secret"]
            codes = [ask(c, key).status_code for c, key in ((ca, one), (cb, two), (ca, two), (cb, one))]
    assert codes == [200, 200, 429, 429]  # two a minute for the team, whichever instance and key
