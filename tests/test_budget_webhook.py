"""Soft budgets: the operator's webhook hears, once per key and period, that a key's spend
reached its soft budget; signed, and retried when the receiver fails.

Real HTTP both ways: the server (uvicorn on a socket, the scripted engine, SQLite or
PostgreSQL) and a receiver (``http.server`` on its own socket) that fails its first answers.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.gateway_util import ADMIN_KEY, chat_body, make_app, postgres_database, serve

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
PRICES = {"kimi-k3": {"input": "1", "output": "2"}}
SECRET = "whsec-" + "0123456789abcdef" * 2


class Receiver:
    """Answers 500 to its first ``failures`` deliveries, 204 after; keeps every one."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.got: list[tuple[dict[str, str], bytes, int]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # http.server calls it by this name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                status = 500 if len(receiver.got) < receiver.failures else 204
                receiver.got.append(({k.lower(): v for k, v in self.headers.items()}, body, status))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/budget"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def delivered(self) -> list[dict[str, Any]]:
        return [json.loads(body) for _, body, status in self.got if status == 204]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Clock:
    def __init__(self, at: datetime) -> None:
        self.at = at

    def __call__(self) -> datetime:
        return self.at


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.integration)])
def backend(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    if request.param == "sqlite":
        yield {}
        return
    with postgres_database() as url:
        yield {"database_url": url}


def wait_for(what: Callable[[], bool], message: str) -> None:
    deadline = time.monotonic() + 30
    while not what():
        if time.monotonic() > deadline:
            raise AssertionError(message)
        time.sleep(0.02)


def verify(secret: str, headers: dict[str, str], body: bytes) -> bool:
    """What a receiver does (docs/gateway.md): recompute the signature, compare in constant time."""
    stamp = headers["x-kimi-timestamp"]
    expected = "sha256=" + hmac.new(secret.encode(), stamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, headers["x-kimi-signature"]) and abs(time.time() - int(stamp)) < 300


def test_soft_budget_webhook_is_signed_retried_and_sent_once_per_period(
    tmp_path: Path, backend: dict[str, Any]
) -> None:
    receiver = Receiver(failures=2)
    settings = {"prices": PRICES, "budget_webhook_url": receiver.url, "budget_webhook_secret": SECRET, **backend}
    app, _ = make_app(tmp_path, **settings)
    gateway = app.state.kimi.gateway
    clock = Clock(datetime(2027, 5, 4, 22, tzinfo=UTC))
    gateway.clock = clock
    assert gateway.alerts.webhook is not None
    gateway.alerts.webhook.backoff = 0.01  # the retries' pause, short for the test
    try:
        with serve(app) as url, httpx.Client(base_url=url) as c:
            made = c.post(
                "/admin/v1/keys",
                headers=ADMIN,
                json={
                    "name": "team-a",
                    "budget_usd": "1",
                    "soft_budget_usd": "0.000001",
                    "budget_period": "daily",
                    "models": ["kimi-k3"],
                },
            ).json()
            key = {"Authorization": f"Bearer {made['secret']}"}
            before = c.get("/v1/key/info", headers=key).json()["info"]
            assert before["soft_budget"] == "0.000001" and before["soft_budget_reached"] is False

            # One request takes the key past its soft budget; the receiver fails twice, then takes it.
            assert c.post("/v1/chat/completions", json=chat_body(), headers=key).status_code == 200
            wait_for(lambda: len(receiver.delivered()) == 1, "the webhook was never delivered")
            assert [status for _, _, status in receiver.got] == [500, 500, 204]
            event = receiver.delivered()[0]
            assert event["type"] == "budget.soft_budget_crossed" and event["key_id"] == made["id"]
            assert event["key_name"] == "team-a" and event["budget_period"] == "daily"
            assert event["period_start"].startswith("2027-05-04T00:00:00")
            assert event["period_resets_at"].startswith("2027-05-05T00:00:00")
            assert Decimal(event["spend_usd"]) >= Decimal("0.000001") and event["soft_budget_usd"] == "0.000001"
            ids = set()
            for headers, body, _ in receiver.got:  # every attempt is signed, the same event each time
                assert verify(SECRET, headers, body), headers
                assert not verify("another-secret-of-some-length", headers, body)
                assert headers["x-kimi-event"] == "budget.soft_budget_crossed"
                ids.add(json.loads(body)["id"])
            assert len(ids) == 1

            def alert() -> dict[str, Any] | None:
                shown: dict[str, Any] | None = c.get("/admin/v1/keys/team-a", headers=ADMIN).json()["soft_budget_alert"]
                return shown

            wait_for(lambda: (alert() or {}).get("delivered_at") is not None, "the delivery was never recorded")
            assert (alert() or {})["webhook_attempts"] == 3 and (alert() or {})["last_error"] is None
            info = c.get("/v1/key/info", headers=key).json()["info"]
            assert info["soft_budget_reached"] is True and info["soft_budget_alert"]["webhook_attempts"] == 3

            # More spending in the same day tells no one again.
            for _ in range(3):
                assert c.post("/v1/chat/completions", json=chat_body(), headers=key).status_code == 200

        # Nor does a restarted server (the claim is in the database, not in memory).
        app2, _ = make_app(tmp_path, **settings)
        app2.state.kimi.gateway.clock = clock
        with serve(app2) as url, httpx.Client(base_url=url) as c:
            assert c.post("/v1/chat/completions", json=chat_body(), headers=key).status_code == 200
            requests = c.get("/admin/v1/usage", params={"key": made["id"], "by": "key"}, headers=ADMIN)
            assert requests.json()["data"][0]["requests"] == 5
            # The next day is a new period: the first request past the soft budget tells again.
            clock.at = datetime(2027, 5, 5, 0, 30, tzinfo=UTC)
            assert c.post("/v1/chat/completions", json=chat_body(), headers=key).status_code == 200
            wait_for(lambda: len(receiver.delivered()) == 2, "the next period's webhook was never delivered")
        assert len(receiver.got) == 4  # the first period's three attempts, then one
        second = receiver.delivered()[1]
        assert second["period_start"].startswith("2027-05-05T00:00:00") and second["id"] != event["id"]
        assert verify(SECRET, receiver.got[3][0], receiver.got[3][1])
    finally:
        receiver.close()


def test_webhook_settings_need_a_secret_and_an_http_url(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="budget_webhook_secret"):
        make_app(tmp_path, budget_webhook_url="http://127.0.0.1:9/hook")
    with pytest.raises(ValueError, match="budget_webhook_url"):
        make_app(tmp_path, budget_webhook_url="file:///etc/passwd", budget_webhook_secret=SECRET)
