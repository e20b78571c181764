"""``GET /v1/key/info``: a key reads its own limits, budget and ledger totals, and nothing else.

Real HTTP (uvicorn on a socket), the scripted engine, SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.gateway_util import ADMIN_KEY, STATIC_KEY, chat_body, make_app, postgres_database, serve

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
PRICES = {"kimi-k3": {"input": "1", "output": "2"}}
LEDGER_SPLIT = (
    "requests",
    "prompt_tokens",
    "cached_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
    "completion_tokens",
    "web_search_calls",
    "cost_usd",
)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.integration)])
def backend(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    if request.param == "sqlite":
        yield {}
        return
    with postgres_database() as url:
        yield {"database_url": url}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def ledger_total(c: httpx.Client, key_id: str, requests: int) -> dict[str, Any]:
    """The admin API's ledger totals for one key, once its rows have been written (batched)."""
    for _ in range(100):
        rows = c.get("/admin/v1/usage", params={"key": key_id, "by": "key"}, headers=ADMIN).json()["data"]
        if rows and rows[0]["requests"] == requests:
            total: dict[str, Any] = rows[0]
            return total
        time.sleep(0.05)
    raise AssertionError(f"the ledger never showed {requests} requests for {key_id}")


def test_a_stored_key_reads_its_own_limits_and_usage(tmp_path: Path, backend: dict[str, Any]) -> None:
    app, _ = make_app(tmp_path, prices=PRICES, **backend)
    with serve(app) as url, httpx.Client(base_url=url) as c:
        made = c.post(
            "/admin/v1/keys",
            headers=ADMIN,
            json={
                "name": "alice",
                "rpm": 50,
                "tpm": 100_000,
                "budget_usd": "5",
                "models": ["kimi-k3"],
                "max_output_tokens": 300,
                "expires_at": "2099-01-01T00:00:00+00:00",
            },
        ).json()
        other = c.post("/admin/v1/keys", headers=ADMIN, json={"name": "bob"}).json()
        assert c.post("/v1/chat/completions", json=chat_body(), headers=bearer(made["secret"])).status_code == 200
        total = ledger_total(c, made["id"], 1)

        r = c.get("/v1/key/info", headers=bearer(made["secret"]))
        assert r.status_code == 200, r.text
        body = r.json()
        info = body["info"]
        assert body["key"] == made["id"] and info["key_id"] == made["id"] and info["key_name"] == "alice"
        assert info["stored"] is True and info["models"] == ["kimi-k3"]
        assert (info["rpm_limit"], info["tpm_limit"], info["max_output_tokens"]) == (50, 100_000, 300)
        assert info["expires"].startswith("2099-01-01T00:00:00")
        assert info["rpm_remaining"] is not None and 0 <= info["rpm_remaining"] <= 50
        assert info["tpm_remaining"] is not None and 0 <= info["tpm_remaining"] <= 100_000
        # Figures equal the ledger's, split as it splits them; the spend is the key's.
        assert {k: info["usage"][k] for k in LEDGER_SPLIT} == {k: total[k] for k in LEDGER_SPLIT}
        assert info["usage"]["prompt_tokens"] > 0 and total["cost_usd"] != "0"
        assert info["max_budget"] == "5" and info["spend"] == total["cost_usd"]
        assert Decimal(info["budget_remaining"]) == Decimal("5") - Decimal(total["cost_usd"])
        text = json.dumps(body)
        assert made["secret"] not in text and other["secret"] not in text and other["id"] not in text

        # Another key sees its own (empty) figures, not alice's.
        theirs = c.get("/v1/key/info", headers=bearer(other["secret"])).json()["info"]
        assert theirs["key_id"] == other["id"] and theirs["key_name"] == "bob"
        assert theirs["usage"]["requests"] == 0 and theirs["usage"]["prompt_tokens"] == 0
        assert theirs["spend"] == "0" and theirs["max_budget"] is None and theirs["rpm_limit"] is None
        assert made["id"] not in json.dumps(theirs)


def test_a_static_key_gets_the_reduced_answer(tmp_path: Path) -> None:
    app, _ = make_app(tmp_path)
    with serve(app) as url, httpx.Client(base_url=url) as c:
        r = c.get("/v1/key/info", headers=bearer(STATIC_KEY))
        assert r.status_code == 200, r.text
        info = r.json()["info"]
        assert info["stored"] is False and "no stored limits" in info["note"]
        assert info["rpm_limit"] is None and info["max_budget"] is None and info["expires"] is None
        assert STATIC_KEY not in r.text


def test_no_or_a_wrong_key_is_a_401(tmp_path: Path) -> None:
    app, _ = make_app(tmp_path)
    with serve(app) as url, httpx.Client(base_url=url) as c:
        for headers in ({}, bearer("sk-kimi-not-a-key")):
            r = c.get("/v1/key/info", headers=headers)
            assert r.status_code == 401, r.text
            error = r.json()["error"]
            assert error["type"] == "authentication_error" and error["message"]
        # The admin key is not an API key: it may not read a key's info either.
        assert c.get("/v1/key/info", headers=ADMIN).status_code == 401
        assert "/v1/key/info" in c.get("/openapi.json", headers=bearer(STATIC_KEY)).json()["paths"]
