"""``GET /v1/users/me/balance`` in Moonshot's shape: what is left of the budget in force for the
calling key (its own or its team's, the smaller), falling by each request's price; a key with
no budget says it has none instead of a number.

Real SQLite, real HTTP (uvicorn on a socket), the scripted engine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from tests.gateway_util import ADMIN_KEY, STATIC_KEY, chat_body, make_app, serve

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
# The scripted answer (12 prompt + 4 output tokens) costs 0.0016 USD on kimi-k3.
PRICES = {"kimi-k3": {"input": "100", "output": "100"}}
BALANCE = "/v1/users/me/balance"


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def admin(c: httpx.Client, method: str, path: str, **body: Any) -> dict[str, Any]:
    r = c.request(method, f"/admin/v1{path}", json=body or None, headers=ADMIN)
    assert r.status_code == 200, r.text
    found: dict[str, Any] = r.json()
    return found


def balance(c: httpx.Client, secret: str) -> dict[str, Any]:
    r = c.get(BALANCE, headers=bearer(secret))
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    assert (body["code"], body["scode"], body["status"]) == (0, "0x0", True)
    data: dict[str, Any] = body["data"]
    return data


def test_the_balance_falls_by_the_price_of_each_request(tmp_path: Path) -> None:
    app, _ = make_app(tmp_path, prices=PRICES)
    with serve(app) as url, httpx.Client(base_url=url) as c:
        key = admin(c, "POST", "/keys", name="alice", budget_usd="0.01", budget_period="monthly", models=["kimi-k3"])[
            "secret"
        ]
        before = balance(c, key)
        assert before["available_balance"] == before["cash_balance"] == 0.01
        assert before["voucher_balance"] == 0.0 and before["currency"] == "USD"
        assert (before["budget_owner"], before["budget_period"]) == ("key", "monthly")
        assert before["budget_reset_at"] is not None
        answer = c.post("/v1/chat/completions", json=chat_body(max_tokens=8), headers=bearer(key))
        assert answer.status_code == 200, answer.text
        after = balance(c, key)
        assert after["available_balance"] == after["cash_balance"] == round(0.01 - 0.0016, 6)
        # The same figure the key's own info reads from the ledger.
        info = c.get("/v1/key/info", headers=bearer(key)).json()["info"]
        assert info["budget_remaining"] == "0.0084"


def test_a_team_budget_that_leaves_less_is_the_balance(tmp_path: Path) -> None:
    app, _ = make_app(tmp_path, prices=PRICES)
    with serve(app) as url, httpx.Client(base_url=url) as c:
        admin(c, "POST", "/teams", name="research", budget_usd="0.005", models=["kimi-k3"])
        key = admin(c, "POST", "/keys", name="bob", team="research", budget_usd="1", models=["kimi-k3"])["secret"]
        data = balance(c, key)
        assert (data["available_balance"], data["budget_owner"], data["budget_period"]) == (0.005, "team", "none")
        assert data["budget_reset_at"] is None  # a budget for life never starts over
        # A team without a budget leaves the key's own.
        admin(c, "POST", "/teams", name="open")
        other = admin(c, "POST", "/keys", name="carol", team="open", budget_usd="2", models=["kimi-k3"])["secret"]
        assert (balance(c, other)["available_balance"], balance(c, other)["budget_owner"]) == (2.0, "key")


def test_a_key_without_a_budget_says_it_has_no_balance(tmp_path: Path) -> None:
    app, _ = make_app(tmp_path, prices=PRICES)
    with serve(app) as url, httpx.Client(base_url=url) as c:
        unlimited = admin(c, "POST", "/keys", name="free")["secret"]
        for secret in (unlimited, STATIC_KEY):
            data = balance(c, secret)
            assert data["available_balance"] is None and data["cash_balance"] is None
            assert data["voucher_balance"] is None and "no balance" in data["note"]
        spent = admin(c, "POST", "/keys", name="spent", budget_usd="0.001", models=["kimi-k3"])["secret"]
        assert c.post("/v1/chat/completions", json=chat_body(max_tokens=8), headers=bearer(spent)).status_code == 200
        assert balance(c, spent)["available_balance"] == 0.0  # overspent by the last request: never negative
        r = c.get(BALANCE, headers=bearer("sk-wrong"))
        assert r.status_code == 401 and r.json()["error"]["type"]
