"""The console over real HTTP (uvicorn on a socket, the scripted engine, SQLite): sign-in and its
cookie, CSRF, who may see what, key forms through the admin API's checks, the playground's
relay, and the API still behind its keys. The browser tests are in test_console_browser.py."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
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
from tests.gateway_util import ADMIN_KEY, STATIC_KEY, chat_body, free_port, make_app, serve

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
PRICES = {"kimi-k3": {"input": "1", "output": "2"}}
_CSRF = re.compile(r'name="csrf" value="([^"]+)"')


@pytest.fixture
def url(tmp_path: Path) -> Iterator[str]:
    app, _ = make_app(tmp_path, prices=PRICES)
    with serve(app) as base:
        yield base


@contextmanager
def signed_in(url: str, key: str) -> Iterator[tuple[httpx.Client, str]]:
    """A client holding a console session for ``key``, and the session's CSRF token."""
    with httpx.Client(base_url=url, follow_redirects=False) as c:
        yield c, _session_csrf(c, key)


def _session_csrf(c: httpx.Client, key: str) -> str:
    token = _CSRF.search(c.get("/console/login").text)
    assert token is not None
    r = c.post("/console/login", data={"csrf": token.group(1), "key": key})
    assert r.status_code == 303, r.text
    page = c.get("/console/playground")
    found = re.search(r'data-csrf="([^"]+)"', page.text)
    assert found is not None
    return found.group(1)


def make_key(url: str, name: str, **limits: Any) -> dict[str, Any]:
    r = httpx.post(f"{url}/admin/v1/keys", headers=ADMIN, json={"name": name, **limits})
    assert r.status_code == 200, r.text
    made: dict[str, Any] = r.json()
    return made


def test_root_and_console_are_open_but_every_api_route_still_needs_a_key(url: str) -> None:
    assert httpx.get(f"{url}/").json()["console"] == "/console/"
    r = httpx.get(f"{url}/", headers={"accept": "text/html"}, follow_redirects=True)
    assert r.status_code == 200 and "Sign in" in r.text  # followed to the sign-in page
    assert httpx.get(f"{url}/console/keys", follow_redirects=True).url.path == "/console/login"
    assert httpx.get(f"{url}/console/static/htmx.min.js").text.startswith("/*! htmx 2.0.11")
    for method, path in (
        ("GET", "/v1/models"),
        ("POST", "/v1/chat/completions"),
        ("GET", "/v1/key/info"),
        ("GET", "/admin/v1/keys"),
        ("GET", "/metrics"),
        ("GET", "/openapi.json"),
    ):
        r = httpx.request(method, f"{url}{path}", json=chat_body() if method == "POST" else None)
        assert r.status_code == 401, path
        assert set(r.json()["error"]) >= {"message", "type", "code"}
    # A polled fragment without a session tells htmx to go to the sign-in page.
    r = httpx.get(f"{url}/console/live/panel", headers={"hx-request": "true"})
    assert r.status_code == 204 and r.headers["hx-redirect"] == "/console/login"


def test_sign_in_sets_a_sealed_http_only_strict_cookie(url: str) -> None:
    with httpx.Client(base_url=url) as c:
        form = _CSRF.search(c.get("/console/login").text)
        assert form is not None
        assert c.post("/console/login", data={"csrf": "forged", "key": ADMIN_KEY}).status_code == 400
        form = _CSRF.search(c.get("/console/login").text)
        assert form is not None
        r = c.post("/console/login", data={"csrf": form.group(1), "key": "sk-wrong"})
        assert r.status_code == 401 and "not valid" in r.text
        form = _CSRF.search(c.get("/console/login").text)
        assert form is not None
        r = c.post("/console/login", data={"csrf": form.group(1), "key": ADMIN_KEY}, follow_redirects=False)
        cookie = next(v for k, v in r.headers.multi_items() if k == "set-cookie" and v.startswith("kimi_console="))
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/console" in cookie
        assert ADMIN_KEY not in cookie and ADMIN_KEY.encode().hex() not in cookie
        assert c.get("/console/keys").status_code == 200
        # A cookie changed by one character is no session at all.
        value = c.cookies["kimi_console"]
        c.cookies.set("kimi_console", value[:-2] + ("A" if value[-2] != "A" else "B") + value[-1], path="/console")
        assert c.get("/console/keys", follow_redirects=False).status_code == 303


def test_forms_need_the_sessions_csrf_token(url: str) -> None:
    with signed_in(url, ADMIN_KEY) as (c, csrf):
        r = c.post("/console/keys", data={"name": "no-token"})
        assert r.status_code == 403
        r = c.post("/console/keys", data={"name": "wrong-token", "csrf": csrf[::-1]})
        assert r.status_code == 403
        names = [k["name"] for k in httpx.get(f"{url}/admin/v1/keys", headers=ADMIN).json()["data"]]
        assert "no-token" not in names and "wrong-token" not in names
        assert c.post("/console/logout", data={}).status_code == 403
        assert c.post("/console/logout", data={"csrf": csrf}).status_code == 303
        assert c.get("/console/keys").status_code == 303  # signed out


def test_key_forms_go_through_the_admin_apis_checks(url: str) -> None:
    with signed_in(url, ADMIN_KEY) as (c, csrf):
        r = c.post("/console/keys", data={"csrf": csrf, "name": "bad", "rpm": "lots"})
        assert r.status_code == 400 and "rpm" in r.text and "whole number" in r.text
        r = c.post("/console/keys", data={"csrf": csrf, "name": "bad", "models": "kimi-k9"})
        assert r.status_code == 400 and "unknown model" in r.text and "(field: models)" in r.text
        r = c.post("/console/keys", data={"csrf": csrf, "name": "bad", "rpm": "0"})
        assert r.status_code == 400 and "rpm" in r.text

        r = c.post(
            "/console/keys",
            data={
                "csrf": csrf,
                "name": "alice",
                "rpm": "60",
                "budget_usd": "5",
                "models": "kimi-k3",
                "expires_at": "2099-01-01T00:00",
            },
        )
        assert r.status_code == 200
        found = re.search(r'id="secret"[^>]*value="(sk-kimi-[^"]+)"', r.text)
        assert found is not None
        secret = found.group(1)
        record = httpx.get(f"{url}/admin/v1/keys/alice", headers=ADMIN).json()
        assert (record["rpm"], record["budget_usd"], record["models"]) == (60, "5", ["kimi-k3"])
        assert record["expires_at"].startswith("2099-01-01T00:00:00")
        assert secret not in c.get("/console/keys").text and secret not in c.get(f"/console/keys/{record['id']}").text

        # Emptying a field clears that limit; the rest stays.
        r = c.post(
            f"/console/keys/{record['id']}",
            data={"csrf": csrf, "rpm": "", "budget_usd": "7", "models": "kimi-k3", "expires_at": "2099-01-01T00:00"},
        )
        assert r.status_code == 303
        record = httpx.get(f"{url}/admin/v1/keys/alice", headers=ADMIN).json()
        assert (record["rpm"], record["budget_usd"]) == (None, "7")

        r = c.post(f"/console/keys/{record['id']}", data={"csrf": csrf, "action": "revoke"})
        assert r.status_code == 303
        assert httpx.get(f"{url}/admin/v1/keys/alice", headers=ADMIN).json()["status"] == "revoked"
        assert c.get("/console/keys/key_nothere").status_code == 404


def test_a_tenant_sees_only_its_own_and_loses_the_console_when_revoked(url: str) -> None:
    other = make_key(url, "someone-else")
    mine = make_key(url, "tenant", budget_usd="1", models=["kimi-k3"])
    r = httpx.post(
        f"{url}/v1/chat/completions", json=chat_body(), headers={"Authorization": f"Bearer {other['secret']}"}
    )
    assert r.status_code == 200
    with signed_in(url, mine["secret"]) as (c, _):
        assert c.get("/console/").headers["location"] == "/console/me"
        for path in ("/console/keys", f"/console/keys/{other['id']}", "/console/live", "/console/live/health"):
            r = c.get(path)
            assert r.status_code == 403 and other["id"] not in r.text, path
        page = c.get("/console/usage", params={"key": other["id"]}).text
        assert other["id"] not in page and 'data-requests="1"' not in page
        assert mine["id"] in c.get("/console/me").text
        httpx.delete(f"{url}/admin/v1/keys/{mine['id']}", headers=ADMIN)
        time.sleep(1.1)  # the key store's cache period
        assert c.get("/console/me").status_code == 303


def test_the_playground_relays_through_the_api_as_the_signed_in_key(url: str) -> None:
    with signed_in(url, STATIC_KEY) as (c, csrf):
        sent = {"endpoint": "chat", "body": chat_body(stream=True)}
        assert c.post("/console/playground/send", json=sent).status_code == 403  # no CSRF header
        r = c.post(
            "/console/playground/send", json={"endpoint": "embeddings", "body": {}}, headers={"x-csrf-token": csrf}
        )
        assert r.status_code == 400 and r.json()["error"]["param"] == "endpoint"
        r = c.post("/console/playground/send", content=b"{", headers={"x-csrf-token": csrf})
        assert r.status_code == 400 and r.json()["error"]["param"] == "body"
        # The API's own 400 comes back as the API wrote it.
        bad = {"endpoint": "chat", "body": {**chat_body(), "messages": []}}
        r = c.post("/console/playground/send", json=bad, headers={"x-csrf-token": csrf})
        assert r.status_code == 400 and r.json()["error"]["param"] == "messages"

        r = c.post("/console/playground/send", json=sent, headers={"x-csrf-token": csrf})
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        assert '"reasoning_content"' in r.text and r.text.rstrip().endswith("data: [DONE]")
    # The request is the key's own: it is in the ledger under that key.
    rows = httpx.get(f"{url}/admin/v1/usage", params={"by": "key"}, headers=ADMIN).json()["data"]
    assert [row["requests"] for row in rows] == [1]

    with signed_in(url, ADMIN_KEY) as (admin, admin_csrf):  # the admin key is no API key: the admin pastes one
        r = admin.post("/console/playground/send", json=sent, headers={"x-csrf-token": admin_csrf})
        assert r.status_code == 400 and r.json()["error"]["param"] == "key"
        r = admin.post(
            "/console/playground/send", json={**sent, "key": "sk-nope"}, headers={"x-csrf-token": admin_csrf}
        )
        assert r.status_code == 401


def test_live_state_and_usage_pages_show_the_servers_figures(url: str) -> None:
    key = make_key(url, "usage-key", budget_usd="3", models=["kimi-k3"])
    for _ in range(3):
        r = httpx.post(
            f"{url}/v1/chat/completions", json=chat_body(), headers={"Authorization": f"Bearer {key['secret']}"}
        )
        assert r.status_code == 200
    with signed_in(url, ADMIN_KEY) as (c, _):
        panel = c.get("/console/live/panel").text
        assert 'data-engine="scripted"' in panel and "No upstreams" in panel
        page = c.get("/console/usage", params={"key": key["id"], "days": "1"}).text
        assert page.count('<g class="bar"') >= 2  # tokens and cost by day (and by model)
        assert 'data-requests="3"' in page
        assert 'data-budget="3"' in page


def test_budget_periods_and_the_soft_budget_show_on_the_key_pages(url: str) -> None:
    made = make_key(url, "periodic", budget_usd="1", budget_period="monthly", soft_budget_usd="0.5", models=["kimi-k3"])
    with signed_in(url, ADMIN_KEY) as (c, csrf):
        listing = c.get("/console/keys").text
        assert "of 1 USD this month, alert at 0.5" in listing
        page = c.get(f"/console/keys/{made['id']}").text
        assert 'name="budget_period"' in page and '<option value="monthly" selected>' in page
        assert 'name="soft_budget_usd"' in page and 'value="0.5"' in page
        # The form changes the period and removes the alert through the admin API.
        form = {"csrf": csrf, "budget_usd": "1", "budget_period": "weekly", "soft_budget_usd": "", "models": "kimi-k3"}
        assert c.post(f"/console/keys/{made['id']}", data=form).status_code == 303
        record = httpx.get(f"{url}/admin/v1/keys/{made['id']}", headers=ADMIN).json()
        assert (record["budget_period"], record["soft_budget_usd"]) == ("weekly", None)
    with signed_in(url, made["secret"]) as (c, _):
        assert "of 1 USD this week" in c.get("/console/me").text


def test_the_live_panel_shows_each_upstreams_breaker(tmp_path: Path) -> None:
    # Nothing listens on this port: each request fails to connect, and one failure opens it.
    down = UpstreamConfig(
        base_url=f"http://127.0.0.1:{free_port()}/v1",
        name="gpu-a",
        retries=0,
        breaker_threshold=1,
        breaker_cooldown=600,
        connect_timeout=2,
    )
    engine = UpstreamEngine([Upstream(down)])
    settings = Settings(api_keys=[STATIC_KEY], data_dir=tmp_path / "data", admin_key=ADMIN_KEY)
    app = create_app(settings, EngineSet({spec.id: engine for spec in CATALOGUE}), KeyRing([STATIC_KEY]))
    with serve(app) as url, signed_in(url, ADMIN_KEY) as (c, _):
        assert "breaker-closed" in c.get("/console/live/panel").text
        r = httpx.post(
            f"{url}/v1/chat/completions", json=chat_body(), headers={"Authorization": f"Bearer {STATIC_KEY}"}
        )
        assert r.status_code >= 500
        panel = c.get("/console/live/panel").text
        assert "gpu-a" in panel and "breaker-open" in panel
        health = c.get("/console/live/health").text
        assert "gpu-a" in health and "could not connect" in health
