"""Budget periods: a daily, weekly or monthly budget starts over in UTC, counted from the ledger.

Real HTTP (uvicorn on a socket), the scripted engine, SQLite, PostgreSQL and Redis. The time is
the gateway's clock, set by the test (``gateway.clock``), so "tomorrow" comes when the test says;
ledger rows are dated by it too.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from kimi_server.cli import app as cli_app
from kimi_server.gate.limits import Limits
from kimi_server.gate.periods import period_end, period_start
from kimi_server.gate.shared_limits import MappedLimiter
from tests.gateway_util import ADMIN_KEY, REDIS_URL, chat_body, make_app, postgres_database, redis_prefix, serve

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
PRICES = {"kimi-k3": {"input": "1", "output": "2"}}


class Clock:
    def __init__(self, at: datetime) -> None:
        self.at = at

    def __call__(self) -> datetime:
        return self.at


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("postgres", marks=pytest.mark.integration),
        pytest.param("redis", marks=pytest.mark.integration),
    ]
)
def backend(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    if request.param == "sqlite":
        yield {}
    elif request.param == "redis":
        yield {"redis_url": REDIS_URL, "redis_prefix": redis_prefix()}
    else:
        with postgres_database() as url:
            yield {"database_url": url}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def info(c: httpx.Client, secret: str) -> dict[str, Any]:
    r = c.get("/v1/key/info", headers=bearer(secret))
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()["info"]
    return body


def test_periods_start_in_utc() -> None:
    at = datetime(2027, 12, 29, 23, 59, 59, tzinfo=UTC)  # a Wednesday
    assert period_start("daily", at) == datetime(2027, 12, 29, tzinfo=UTC)
    assert period_start("weekly", at) == datetime(2027, 12, 27, tzinfo=UTC)  # Monday
    assert period_start("monthly", at) == datetime(2027, 12, 1, tzinfo=UTC)
    assert period_end("monthly", datetime(2027, 12, 1, tzinfo=UTC)) == datetime(2028, 1, 1, tzinfo=UTC)
    assert period_end("weekly", datetime(2027, 12, 27, tzinfo=UTC)) == datetime(2028, 1, 3, tzinfo=UTC)
    assert period_start(None, at) is None and period_end(None, None) is None


def test_a_daily_budget_refuses_when_spent_and_serves_the_next_day(tmp_path: Path, backend: dict[str, Any]) -> None:
    # No lookup cache: a changed key applies to the next request (else within key_cache_seconds).
    app, _ = make_app(tmp_path, prices=PRICES, key_cache_seconds=0, **backend)
    clock = Clock(datetime(2027, 3, 1, 23, 50, tzinfo=UTC))
    app.state.kimi.gateway.clock = clock
    with serve(app) as url, httpx.Client(base_url=url) as c:
        # One request costs more than the budget: the first is served, the next refused.
        made = c.post(
            "/admin/v1/keys",
            headers=ADMIN,
            json={
                "name": "daily",
                "budget_usd": "0.000001",
                "budget_period": "daily",
                "models": ["kimi-k3"],
            },
        ).json()
        assert made["budget_period"] == "daily" and made["period_start"].startswith("2027-03-01T00:00:00")
        secret = made["secret"]
        assert c.post("/v1/chat/completions", json=chat_body(), headers=bearer(secret)).status_code == 200
        refused = c.post("/v1/chat/completions", json=chat_body(), headers=bearer(secret))
        assert refused.status_code == 429, refused.text
        error = refused.json()["error"]
        assert error["type"] == "insufficient_quota" and error["code"] == "insufficient_quota"
        assert "daily budget" in error["message"] and "2027-03-02T00:00:00" in error["message"]

        first = info(c, secret)
        assert first["budget_period"] == "daily"
        assert first["period_start"].startswith("2027-03-01T00:00:00")
        assert first["budget_reset_at"].startswith("2027-03-02T00:00:00")
        day_one = Decimal(first["spend"])
        assert day_one > Decimal("0.000001") and first["budget_remaining"] == "0"
        assert first["total_spend"] == first["spend"]

        # Midnight UTC: the budget starts over, with no job run and nothing lost.
        clock.at = datetime(2027, 3, 2, 0, 0, 1, tzinfo=UTC)
        assert c.post("/v1/chat/completions", json=chat_body(), headers=bearer(secret)).status_code == 200
        assert c.post("/v1/chat/completions", json=chat_body(), headers=bearer(secret)).status_code == 429
        second = info(c, secret)
        assert second["period_start"].startswith("2027-03-02T00:00:00")
        assert second["budget_reset_at"].startswith("2027-03-03T00:00:00")
        assert Decimal(second["total_spend"]) == day_one + Decimal(second["spend"])

        # The ledger dates each row in its day; the admin API shows the period's spend.
        days = c.get("/admin/v1/usage", params={"key": made["id"], "by": "day"}, headers=ADMIN).json()["data"]
        assert [(d["day"], d["requests"]) for d in days] == [("2027-03-01", 1), ("2027-03-02", 1)]
        shown = c.get(f"/admin/v1/keys/{made['id']}", headers=ADMIN).json()
        assert shown["period_spent_usd"] == second["spend"] and shown["spent_usd"] == second["total_spend"]

        # A lifetime budget again: everything spent counts, so the key stays refused.
        r = c.patch(f"/admin/v1/keys/{made['id']}", headers=ADMIN, json={"budget_period": "none"})
        assert r.status_code == 200 and r.json()["budget_period"] == "none" and r.json()["period_start"] is None
        clock.at = datetime(2027, 3, 3, 1, tzinfo=UTC)
        assert c.post("/v1/chat/completions", json=chat_body(), headers=bearer(secret)).status_code == 429
        assert info(c, secret)["spend"] == second["total_spend"]


def test_a_monthly_budget_counts_the_whole_month(tmp_path: Path) -> None:
    app, _ = make_app(tmp_path, prices=PRICES)
    clock = Clock(datetime(2027, 3, 31, 12, tzinfo=UTC))
    app.state.kimi.gateway.clock = clock
    with serve(app) as url, httpx.Client(base_url=url) as c:
        made = c.post(
            "/admin/v1/keys",
            headers=ADMIN,
            json={
                "name": "monthly",
                "budget_usd": "1",
                "budget_period": "monthly",
                "models": ["kimi-k3"],
            },
        ).json()
        assert c.post("/v1/chat/completions", json=chat_body(), headers=bearer(made["secret"])).status_code == 200
        march = info(c, made["secret"])
        assert march["period_start"].startswith("2027-03-01") and march["budget_reset_at"].startswith("2027-04-01")
        assert Decimal(march["budget_remaining"]) == Decimal("1") - Decimal(march["spend"]) < 1
        clock.at = datetime(2027, 4, 1, tzinfo=UTC)
        april = info(c, made["secret"])
        assert april["spend"] == "0" and april["budget_remaining"] == "1" and april["total_spend"] == march["spend"]


def test_bad_periods_and_soft_budgets_are_400s_naming_the_field(tmp_path: Path) -> None:
    app, _ = make_app(tmp_path, prices=PRICES)
    with serve(app) as url, httpx.Client(base_url=url) as c:
        for body, param in (
            ({"budget_period": "hourly"}, "budget_period"),
            ({"budget_period": 5}, "budget_period"),
            ({"budget_period": "daily\u0000"}, "budget_period"),
            ({"budget_usd": "1", "soft_budget_usd": "1"}, "soft_budget_usd"),
            ({"budget_usd": "1", "soft_budget_usd": "-1"}, "soft_budget_usd"),
            ({"soft_budget_usd": "0.0000000001"}, "soft_budget_usd"),
        ):
            r = c.post("/admin/v1/keys", headers=ADMIN, json={"name": "bad", "models": ["kimi-k3"], **body})
            assert r.status_code == 400, (body, r.text)
            assert r.json()["error"]["param"] == param, (body, r.text)
        made = c.post(
            "/admin/v1/keys",
            headers=ADMIN,
            json={"name": "ok", "budget_usd": "2", "soft_budget_usd": "1", "models": ["kimi-k3"]},
        ).json()
        assert made["soft_budget_usd"] == "1" and made["budget_period"] == "none"
        # Lowering the budget under the soft budget is refused too; clearing the soft one works.
        r = c.patch("/admin/v1/keys/ok", headers=ADMIN, json={"budget_usd": "0.5"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "soft_budget_usd"
        r = c.patch("/admin/v1/keys/ok", headers=ADMIN, json={"budget_usd": "0.5", "clear": ["soft_budget"]})
        assert r.status_code == 200 and r.json()["soft_budget_usd"] is None


def test_cli_sets_budget_periods_and_soft_budgets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KIMI_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("KIMI_PRICES", json.dumps(PRICES))
    runner = CliRunner()
    made = runner.invoke(
        cli_app,
        [
            "keys",
            "create",
            "--name",
            "carol",
            "--budget",
            "5",
            "--budget-period",
            "weekly",
            "--soft-budget",
            "4",
            "--models",
            "kimi-k3",
        ],
    )
    assert made.exit_code == 0, made.output
    shown = json.loads(runner.invoke(cli_app, ["keys", "show", "carol", "--json"]).output)[0]
    assert (shown["budget_period"], shown["soft_budget_usd"], shown["budget_usd"]) == ("weekly", "4", "5")
    assert shown["period_resets_at"] is not None
    changed = runner.invoke(
        cli_app, ["keys", "update", "carol", "--budget-period", "monthly", "--clear", "soft_budget"]
    )
    assert changed.exit_code == 0, changed.output
    shown = json.loads(runner.invoke(cli_app, ["keys", "show", "carol", "--json"]).output)[0]
    assert shown["budget_period"] == "monthly" and shown["soft_budget_usd"] is None
    bad = runner.invoke(cli_app, ["keys", "update", "carol", "--budget-period", "fortnightly"])
    assert bad.exit_code != 0 and "--budget-period" in bad.output
    bad = runner.invoke(cli_app, ["keys", "update", "carol", "--soft-budget", "9"])
    assert bad.exit_code != 0 and "--soft-budget" in bad.output


def test_the_workers_shared_file_starts_a_new_period_over(tmp_path: Path) -> None:
    """``serve --workers`` without Redis: the limits file keeps the period with the spend."""

    async def run() -> None:
        a, b = MappedLimiter(tmp_path / "l.map"), MappedLimiter(tmp_path / "l.map")
        today = Limits(budget_nanos=100, spent_nanos=0, period=7)
        assert (await a.reserve("key", today, 0, 10)).admitted
        await b.settle("key", today, 0, 10, 150)  # the request cost more than the budget
        assert (await a.reserve("key", today, 0, 10)).reason == "quota"
        # The next period: the ledger's figure for it (nothing yet) replaces the old spend.
        tomorrow = Limits(budget_nanos=100, spent_nanos=0, period=8)
        assert (await b.reserve("key", tomorrow, 0, 10)).admitted
        assert (await a.reserve("key", tomorrow, 0, 10)).admitted  # holds 20 of 100, spent 0
        await a.close()
        await b.close()

    asyncio.run(run())
