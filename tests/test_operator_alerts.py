"""The alerts beside the soft budget, to the same signed, retried webhook, each sent once: a
key's budget spent, a key about to expire, an upstream's circuit breaker opening.

Real HTTP both ways: the server (uvicorn on a socket, the scripted engine or an upstream that
is down, SQLite or PostgreSQL) and a receiver (``http.server`` on its own socket)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest

from kimi_server.engines.upstream.engine import UpstreamEngine
from kimi_server.engines.upstream.relay import Upstream
from kimi_server.gate.auth import KeyRing
from kimi_server.http.app import create_app
from kimi_server.policy.catalogue import CATALOGUE
from kimi_server.serving.common import EngineSet
from kimi_server.settings import Settings, UpstreamConfig
from tests.gateway_util import ADMIN_KEY, STATIC_KEY, chat_body, free_port, make_app, postgres_database, serve
from tests.test_budget_webhook import SECRET, Receiver, verify, wait_for

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
PRICES = {"kimi-k3": {"input": "1", "output": "2"}}


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.integration)])
def backend(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    if request.param == "sqlite":
        yield {}
        return
    with postgres_database() as url:
        yield {"database_url": url}


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    got = Receiver(failures=1)  # the first delivery fails: each alert is retried
    try:
        yield got
    finally:
        got.close()


def hook(receiver: Receiver) -> dict[str, Any]:
    return {"budget_webhook_url": receiver.url, "budget_webhook_secret": SECRET}


def fast_retries(app: Any) -> None:
    app.state.kimi.gateway.alerts.webhook.backoff = 0.01


def delivered(receiver: Receiver, kind: str) -> list[dict[str, Any]]:
    return [event for event in receiver.delivered() if event["type"] == kind]


def test_a_spent_budget_is_told_once(tmp_path: Path, backend: dict[str, Any], receiver: Receiver) -> None:
    app, _ = make_app(tmp_path, prices=PRICES, **hook(receiver), **backend)
    fast_retries(app)
    with serve(app) as url, httpx.Client(base_url=url) as c:
        made = c.post(
            "/admin/v1/keys",
            headers=ADMIN,
            json={"name": "small", "budget_usd": "0.000001", "budget_period": "monthly", "models": ["kimi-k3"]},
        ).json()
        key = {"Authorization": f"Bearer {made['secret']}"}
        # Admitted while nothing is spent; its cost takes the key past its budget.
        assert c.post("/v1/chat/completions", json=chat_body(), headers=key).status_code == 200
        wait_for(lambda: len(delivered(receiver, "budget.spent")) == 1, "the budget.spent event never came")
        refused = c.post("/v1/chat/completions", json=chat_body(), headers=key)
        assert refused.status_code == 429
        time.sleep(0.3)  # a second event, if one were sent, would be on its way by now
    (event,) = delivered(receiver, "budget.spent")
    assert event["key_id"] == made["id"] and event["key_name"] == "small" and event["budget_period"] == "monthly"
    assert event["max_budget_usd"] == "0.000001" and Decimal(event["spend_usd"]) >= Decimal("0.000001")
    assert event["period_resets_at"] is not None and event["id"].startswith("evt_spent_")
    assert not delivered(receiver, "budget.soft_budget_crossed")  # the key has no soft budget
    assert len(receiver.got) == 2  # the failed attempt and its retry, of the one event
    for headers, body, _ in receiver.got:
        assert verify(SECRET, headers, body) and headers["x-kimi-event"] == "budget.spent"


def test_a_key_about_to_expire_is_told_once(tmp_path: Path, backend: dict[str, Any], receiver: Receiver) -> None:
    settings = {**hook(receiver), **backend, "key_expiry_alert_days": 3}
    soon = datetime.now(UTC) + timedelta(days=2)
    app, _ = make_app(tmp_path, **settings)
    with serve(app) as url, httpx.Client(base_url=url, headers=ADMIN) as c:
        made = c.post("/admin/v1/keys", json={"name": "expiring", "expires_at": soon.isoformat()}).json()
        later = datetime.now(UTC) + timedelta(days=30)
        assert c.post("/admin/v1/keys", json={"name": "later", "expires_at": later.isoformat()}).status_code == 200
        gone = c.post("/admin/v1/keys", json={"name": "revoked", "expires_at": soon.isoformat()}).json()
        assert c.delete(f"/admin/v1/keys/{gone['id']}").status_code == 200
    # Keys are looked at when the server starts (and every ten minutes after).
    for _ in range(2):  # a restart tells no one again: the claim is in the database
        app, _ = make_app(tmp_path, **settings)
        fast_retries(app)
        with serve(app) as url:
            wait_for(lambda: len(delivered(receiver, "key.expiring")) == 1, "the key.expiring event never came")
            metrics = httpx.get(f"{url}/metrics", headers=ADMIN).text
            assert "kimi_keys_expiring_soon 1.0" in metrics
            time.sleep(0.3)
    (event,) = delivered(receiver, "key.expiring")
    assert event["key_id"] == made["id"] and event["key_name"] == "expiring"
    assert datetime.fromisoformat(event["expires_at"]) == soon
    assert timedelta(days=1, hours=23) < timedelta(seconds=event["expires_in_seconds"]) <= timedelta(days=2)
    assert all(verify(SECRET, h, b) for h, b, _ in receiver.got)


def test_an_upstream_breaker_opening_is_told_once(tmp_path: Path, receiver: Receiver) -> None:
    down = UpstreamConfig(
        base_url=f"http://127.0.0.1:{free_port()}/v1",  # nothing listens: every call fails to connect
        name="gpu-a",
        retries=0,
        breaker_threshold=1,
        breaker_cooldown=0.2,
        connect_timeout=2,
    )
    engine = UpstreamEngine([Upstream(down)])
    settings = Settings(api_keys=[STATIC_KEY], data_dir=tmp_path / "data", admin_key=ADMIN_KEY, **hook(receiver))
    app = create_app(settings, EngineSet({spec.id: engine for spec in CATALOGUE}), KeyRing([STATIC_KEY]))
    fast_retries(app)
    bearer = {"Authorization": f"Bearer {STATIC_KEY}"}
    with serve(app) as url:
        assert httpx.post(f"{url}/v1/chat/completions", json=chat_body(), headers=bearer).status_code >= 500
        wait_for(lambda: len(delivered(receiver, "upstream.breaker_opened")) == 1, "the breaker event never came")
        time.sleep(0.3)  # past the cooldown: the next request is the probe, which fails and opens it again
        assert httpx.post(f"{url}/v1/chat/completions", json=chat_body(), headers=bearer).status_code >= 500
        time.sleep(0.3)
    (event,) = delivered(receiver, "upstream.breaker_opened")
    assert event["upstream"] == "gpu-a" and event["failures"] == 1 and event["cooldown_seconds"] == 0.2
    assert event["models"] == sorted(spec.id for spec in CATALOGUE) and event["engine"] == engine.name
    assert str(down.base_url) not in str(event)  # named, not addressed
    assert all(verify(SECRET, h, b) for h, b, _ in receiver.got)
