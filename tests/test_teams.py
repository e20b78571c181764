"""Teams and tags: a team's budget, requests and tokens per minute are shared by its keys and its
models bound theirs; usage and the request log group and filter by team and tag.

Real SQLite, real HTTP (uvicorn on a socket), the scripted engine.
"""

from __future__ import annotations

import sqlite3
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx

from tests.gateway_util import ADMIN_KEY, chat_body, make_app, serve

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
# The scripted answer (12 prompt + 4 output tokens) costs 0.0016 USD on kimi-k3.
PRICES = {"kimi-k3": {"input": "100", "output": "100"}}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def admin(c: httpx.Client, method: str, path: str, **body: Any) -> dict[str, Any]:
    r = c.request(method, f"/admin/v1{path}", json=body or None, headers=ADMIN)
    assert r.status_code == 200, r.text
    found: dict[str, Any] = r.json()
    return found


def alert_rows(tmp: Path) -> list[tuple[str, str | None]]:
    with sqlite3.connect(tmp / "data" / "kimi.db") as db:
        return [(k, e) for k, e in db.execute("SELECT key_id, last_error FROM budget_alerts")]


def ask(c: httpx.Client, secret: str, model: str = "kimi-k3") -> httpx.Response:
    return c.post("/v1/chat/completions", json=chat_body(model, max_tokens=8), headers=bearer(secret))


def test_a_team_budget_is_shared_by_its_keys(tmp_path: Path) -> None:
    app, _ = make_app(tmp_path, prices=PRICES)
    with serve(app) as url, httpx.Client(base_url=url) as c:
        team = admin(c, "POST", "/teams", name="research", budget_usd="0.001", models=["kimi-k3"])
        assert team["id"].startswith("team_") and team["budget_usd"] == "0.001"
        first = admin(c, "POST", "/keys", name="alice", team="research")
        second = admin(c, "POST", "/keys", name="bob", team=team["id"], budget_usd="5")
        assert first["team_id"] == second["team_id"] == team["id"] and first["team"] == "research"
        outsider = admin(c, "POST", "/keys", name="carol", budget_usd="5", models=["kimi-k3"])

        assert ask(c, first["secret"]).status_code == 200  # spends 0.0016 of the team's 0.001
        refused = ask(c, second["secret"])
        assert refused.status_code == 429, refused.text
        error = refused.json()["error"]
        assert error["code"] == "insufficient_quota" and "team" in error["message"]
        assert ask(c, outsider["secret"]).status_code == 200  # another team's spend is not its

        shown = admin(c, "GET", "/teams/research")
        assert shown["spent_usd"] == "0.0016" and shown["period_spent_usd"] == "0.0016"
        # The key's own budget is untouched by the refusal; the team's spend is on its rows only.
        assert admin(c, "GET", "/keys/bob")["spent_usd"] == "0"
        # A bigger team budget lets the second key in (every instance reads it within a second).
        admin(c, "PATCH", "/teams/research", budget_usd="1")
        deadline = time.monotonic() + 10
        while ask(c, second["secret"]).status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.1)


def test_team_limits_are_shared_and_a_key_gets_the_tighter(tmp_path: Path) -> None:
    app, _ = make_app(tmp_path)
    with serve(app) as url, httpx.Client(base_url=url) as c:
        admin(c, "POST", "/teams", name="small", rpm=2, models=["kimi-k3"])
        one = admin(c, "POST", "/keys", name="one", team="small", rpm=100)
        two = admin(c, "POST", "/keys", name="two", team="small")
        first = ask(c, one["secret"])
        assert first.status_code == 200
        # The key allows 100 a minute, its team 2: the headers say the tighter.
        assert first.headers["x-ratelimit-limit-requests"] == "2"
        assert first.headers["x-ratelimit-remaining-requests"] == "1"
        assert ask(c, two["secret"]).status_code == 200
        refused = ask(c, one["secret"])
        assert refused.status_code == 429 and "for the team" in refused.json()["error"]["message"]
        assert int(refused.headers["retry-after"]) >= 1
        # The team's models bound its keys: another model does not exist for them.
        other = ask(c, two["secret"], "kimi-k3.1-pro")
        assert other.status_code == 404 and other.json()["error"]["param"] == "model"
        models = c.get("/v1/models", headers=bearer(two["secret"])).json()["data"]
        assert [m["id"] for m in models] == ["kimi-k3"]


def test_a_key_refused_by_its_team_keeps_its_own_allowance(tmp_path: Path) -> None:
    app, _ = make_app(tmp_path)
    with serve(app) as url, httpx.Client(base_url=url) as c:
        admin(c, "POST", "/teams", name="tiny", rpm=1)
        hog = admin(c, "POST", "/keys", name="hog", team="tiny")
        mine = admin(c, "POST", "/keys", name="mine", team="tiny", rpm=1)
        assert ask(c, hog["secret"]).status_code == 200
        assert ask(c, mine["secret"]).status_code == 429  # the team is out
        # Leaving the team: the key's own one request a minute was given back, not spent.
        admin(c, "PATCH", "/keys/mine", clear=["team"])
        assert admin(c, "GET", "/keys/mine")["team_id"] is None
        deadline = time.monotonic() + 10  # the lookup cache holds the key for under a second
        while (r := ask(c, mine["secret"])).status_code != 200:
            assert "for the team" in r.json()["error"]["message"], r.text  # never the key's own
            assert time.monotonic() < deadline, r.text
            time.sleep(0.1)


def test_usage_and_the_request_log_group_and_filter_by_team_and_tag(tmp_path: Path) -> None:
    app, _ = make_app(tmp_path, prices=PRICES)
    with serve(app) as url, httpx.Client(base_url=url) as c:
        admin(c, "POST", "/teams", name="web")
        a = admin(c, "POST", "/keys", name="a", team="web", tags=["frontend", "prod"])
        b = admin(c, "POST", "/keys", name="b", tags=["prod"])
        plain = admin(c, "POST", "/keys", name="plain")
        assert a["tags"] == ["frontend", "prod"]
        for secret, times in ((a["secret"], 2), (b["secret"], 1), (plain["secret"], 1)):
            for _ in range(times):
                assert ask(c, secret).status_code == 200

        by_team = {r["team"]: r for r in admin(c, "GET", "/usage?by=team")["data"]}
        assert by_team["(no team)"]["requests"] == 2
        web = next(r for r in by_team.values() if r["name"] == "web")
        assert web["requests"] == 2 and web["cost_usd"] == "0.0032"
        by_tag = {r["tag"]: r["requests"] for r in admin(c, "GET", "/usage?by=tag")["data"]}
        assert by_tag == {"frontend": 2, "prod": 3, "(untagged)": 1}
        assert admin(c, "GET", "/usage?by=model&team=web")["data"][0]["requests"] == 2

        in_team = admin(c, "GET", "/requests?team=web")["data"]
        assert len(in_team) == 2 and {r["key_name"] for r in in_team} == {"a"}
        assert all(r["team"] == "web" and r["tags"] == ["frontend", "prod"] for r in in_team)
        tagged = admin(c, "GET", "/requests?tag=prod")["data"]
        assert sorted(r["key_name"] for r in tagged) == ["a", "a", "b"]
        assert admin(c, "GET", "/requests?tag=nobody")["data"] == []
        # Tags are checked like every stored text.
        r = c.patch("/admin/v1/keys/b", json={"tags": ["a,b"]}, headers=ADMIN)
        assert r.status_code == 400 and r.json()["error"]["param"] == "tags"
        admin(c, "PATCH", "/keys/b", clear=["tags"])
        assert admin(c, "GET", "/keys/b")["tags"] == []


def test_a_team_with_active_keys_is_not_deleted(tmp_path: Path) -> None:
    app, _ = make_app(tmp_path, prices=PRICES)
    with serve(app) as url, httpx.Client(base_url=url) as c:
        admin(c, "POST", "/teams", name="gone")
        member = admin(c, "POST", "/keys", name="member", team="gone")
        assert ask(c, member["secret"]).status_code == 200
        r = c.delete("/admin/v1/teams/gone", headers=ADMIN)
        assert r.status_code == 400 and r.json()["error"]["code"] == "team_not_empty"
        admin(c, "DELETE", "/keys/member")
        assert admin(c, "DELETE", "/teams/gone")["deleted"] is True
        assert c.get("/admin/v1/teams/gone", headers=ADMIN).status_code == 404
        assert admin(c, "GET", "/keys/member")["team_id"] is None
        # Its ledger rows keep its id, so history still adds up by team.
        (row,) = admin(c, "GET", "/usage?by=team")["data"]
        assert row["name"] == "(deleted team)" and row["requests"] == 1
        # A key cannot join a team that does not exist; a team's fields are checked as a key's.
        r = c.post("/admin/v1/keys", json={"name": "x", "team": "nowhere"}, headers=ADMIN)
        assert r.status_code == 404 and r.json()["error"]["param"] == "team"
        over = {"name": "t", "budget_usd": "1", "soft_budget_usd": "2", "models": ["kimi-k3"]}
        r = c.post("/admin/v1/teams", json=over, headers=ADMIN)
        assert r.status_code == 400 and r.json()["error"]["param"] == "soft_budget_usd"
        r = c.post("/admin/v1/teams", json={"name": "t", "rpm": 0}, headers=ADMIN)
        assert r.status_code == 400 and r.json()["error"]["param"] == "rpm"


def test_a_team_soft_budget_is_recorded_once(tmp_path: Path) -> None:
    app, _ = make_app(tmp_path, prices=PRICES)
    with serve(app) as url, httpx.Client(base_url=url) as c:
        admin(c, "POST", "/teams", name="watched", budget_usd="1", soft_budget_usd="0.002", models=["kimi-k3"])
        key = admin(c, "POST", "/keys", name="w", team="watched")
        assert ask(c, key["secret"]).status_code == 200
        assert admin(c, "GET", "/teams/watched")["soft_budget_alert"] is None  # 0.0016 < 0.002
        # The check runs off the request, once the spend read with the key says it may be due.
        deadline = time.monotonic() + 10
        while not (rows := alert_rows(tmp_path)) or rows[0][1] is None:
            assert time.monotonic() < deadline
            assert ask(c, key["secret"]).status_code == 200
            time.sleep(0.2)
        team_id = admin(c, "GET", "/teams/watched")["id"]
        assert rows == [(team_id, "no webhook configured")]
        alert = admin(c, "GET", "/teams/watched")["soft_budget_alert"]
        assert alert is not None and Decimal(alert["spend_at_alert"]) >= Decimal("0.002")
        assert ask(c, key["secret"]).status_code == 200
        assert len(alert_rows(tmp_path)) == 1  # once per period


def test_a_key_sees_its_team_in_its_own_info(tmp_path: Path) -> None:
    app, _ = make_app(tmp_path, prices=PRICES)
    with serve(app) as url, httpx.Client(base_url=url) as c:
        admin(c, "POST", "/teams", name="seen", rpm=9, budget_usd="1", budget_period="daily", models=["kimi-k3"])
        key = admin(c, "POST", "/keys", name="k", team="seen", tags=["x"])
        assert ask(c, key["secret"]).status_code == 200
        info = c.get("/v1/key/info", headers=bearer(key["secret"])).json()["info"]
    assert info["tags"] == ["x"]
    team = info["team"]
    assert (team["team_name"], team["rpm_limit"], team["max_budget"], team["models"]) == ("seen", 9, "1", ["kimi-k3"])
    assert team["budget_period"] == "daily" and team["budget_reset_at"] is not None
