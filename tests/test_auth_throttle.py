"""Guessing keys is throttled, over real sockets from distinct client addresses (127.0.0.x): wrong
console sign-ins, admin keys and API keys are answered, then refused with 429 and Retry-After in
the API's error shape; a right key from another address still works; a key prefix attacked from
many addresses stays open to the addresses that already use it; the sign-in form's CSRF token
is the server's own; every console answer carries its security headers; two instances on one
Redis (and PostgreSQL) throttle as one."""

from __future__ import annotations

import logging
import re
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from kimi_server.console.login_token import LoginTokens
from tests.gateway_util import (
    ADMIN_KEY,
    REDIS_URL,
    STATIC_KEY,
    chat_body,
    make_app,
    postgres_database,
    redis_prefix,
    serve,
)

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
_CSRF = re.compile(r'name="csrf" value="([^"]+)"')
FAST: dict[str, Any] = {"auth_max_delay": 0.05}  # the waits before a lock, short: these tests count, not time
THROTTLED = "too_many_failed_authentications"


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@contextmanager
def client_at(url: str, address: str) -> Iterator[httpx.Client]:
    """A client whose connections come from ``address`` (any 127.0.0.x reaches the server)."""
    transport = httpx.HTTPTransport(local_address=address)
    with httpx.Client(base_url=url, transport=transport, timeout=60, follow_redirects=False) as c:
        yield c


def sign_in(c: httpx.Client, key: str) -> httpx.Response:
    form = _CSRF.search(c.get("/console/login").text)
    assert form is not None
    return c.post("/console/login", data={"csrf": form.group(1), "key": key})


def wrong_key() -> str:
    return "sk-kimi-" + secrets.token_urlsafe(32)


def assert_throttled(r: httpx.Response) -> int:
    """A 429 in the API's error shape; its Retry-After."""
    assert r.status_code == 429, (r.status_code, r.text)
    error = r.json()["error"]
    assert error["type"] == "rate_limit_error" and error["code"] == THROTTLED and "try again" in error["message"]
    retry = int(r.headers["retry-after"])
    assert retry >= 1
    return retry


def test_wrong_sign_ins_end_in_429_and_a_right_key_elsewhere_still_works(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="kimi_server.gate.auth_throttle")
    app, _ = make_app(tmp_path)  # the default limits and waits
    with serve(app) as url:
        with client_at(url, "127.0.0.2") as attacker:
            statuses = []
            for _ in range(200):
                r = sign_in(attacker, "sk-guess-" + secrets.token_hex(8))
                statuses.append(r.status_code)
                if r.status_code == 429:
                    break
            assert statuses[-1] == 429 and set(statuses[:-1]) == {401}, statuses
            assert int(r.headers["retry-after"]) >= 1 and "try again" in r.text
            assert r.headers["content-security-policy"].startswith("default-src 'none'")
            # Locked: the right key is refused from here too (a guesser learns nothing more),
            # and so is the API, whose failures count with the sign-ins.
            assert sign_in(attacker, ADMIN_KEY).status_code == 429
            assert_throttled(attacker.get("/v1/models", headers=bearer(STATIC_KEY)))
        with client_at(url, "127.0.0.3") as someone_else:
            assert sign_in(someone_else, ADMIN_KEY).status_code == 303
            assert someone_else.get("/console/keys").status_code == 200
    lockouts = [r.getMessage() for r in caplog.records if "lockout" in r.getMessage()]
    assert len(lockouts) == 1 and "127.0.0.2" in lockouts[0] and "console" in lockouts[0], lockouts


def test_wrong_admin_keys_are_throttled_on_the_admin_api_and_metrics(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="kimi_server.gate.auth_throttle")
    app, _ = make_app(tmp_path, **FAST)
    guesses = [f"sk-admin-guess-{n:04d}" for n in range(40)]
    with serve(app) as url:
        with client_at(url, "127.0.0.4") as attacker:
            codes = []
            for guess in guesses:
                r = attacker.get("/admin/v1/keys", headers=bearer(guess))
                codes.append(r.status_code)
                if r.status_code == 429:
                    break
            assert codes == [403] * 19 + [429], codes
            assert_throttled(r)
            assert_throttled(attacker.get("/metrics", headers=ADMIN))  # the right key, from here
            assert_throttled(attacker.get("/admin/v1/keys", headers=ADMIN))
        with client_at(url, "127.0.0.5") as operator:
            assert operator.get("/admin/v1/keys", headers=ADMIN).status_code == 200
            # A tenant's valid key where the admin key is needed is refused but not a guess.
            for _ in range(30):
                assert operator.get("/metrics", headers=bearer(STATIC_KEY)).status_code == 403
            metrics = operator.get("/metrics", headers=ADMIN).text
    assert 'kimi_auth_lockouts_total{scope="address"} 1.0' in metrics
    assert 'kimi_auth_failures_total{surface="admin"} 20.0' in metrics
    assert 'kimi_auth_throttled_total{surface="admin"} 3.0' in metrics
    (line,) = [r.getMessage() for r in caplog.records if "lockout" in r.getMessage()]
    assert "127.0.0.4" in line and "admin" in line
    assert not any(guess in line or guess[:12] in line for guess in guesses) and ADMIN_KEY not in line


def test_wrong_api_keys_are_throttled_and_a_right_key_elsewhere_still_works(tmp_path: Path) -> None:
    app, _ = make_app(tmp_path, **FAST)
    with serve(app) as url:
        with client_at(url, "127.0.0.6") as attacker:
            codes = []
            for _ in range(100):
                r = attacker.post("/v1/chat/completions", json=chat_body(), headers=bearer(wrong_key()))
                codes.append(r.status_code)
                if r.status_code == 429:
                    break
            assert codes == [401] * 19 + [429], codes
            retry = assert_throttled(r)
            assert retry <= 600 / 20 + 1  # one more try as the count drains: window / limit
            assert_throttled(attacker.get("/v1/models", headers=bearer(STATIC_KEY)))
            # A route that asks for its key itself (not the guard) is throttled alike.
            assert_throttled(attacker.get("/health", params={"deep": 1}, headers=bearer(STATIC_KEY)))
            # No key at all is no guess: still the plain 401.
            assert attacker.get("/v1/models").status_code == 401
        with client_at(url, "127.0.0.7") as client:
            r = client.post("/v1/chat/completions", json=chat_body(), headers=bearer(STATIC_KEY))
            assert r.status_code == 200, r.text
            stored = client.post("/admin/v1/keys", json={"name": "t"}, headers=ADMIN).json()["secret"]
            assert client.get("/v1/models", headers=bearer(stored)).status_code == 200


def test_a_prefix_guessed_from_many_addresses_stays_open_to_its_own_clients(tmp_path: Path) -> None:
    # Addresses are let be here (a high limit): only the prefix's count, over them all, locks.
    app, _ = make_app(tmp_path, auth_max_failures=1000, auth_max_prefix_failures=6, **FAST)
    with serve(app) as url:
        with client_at(url, "127.0.0.8") as owner:
            secret = owner.post("/admin/v1/keys", json={"name": "victim"}, headers=ADMIN).json()["secret"]
            assert owner.get("/v1/models", headers=bearer(secret)).status_code == 200  # known here
        head = secret[:12]  # what an attacker might have seen of it
        codes = []
        for n in range(6):
            with client_at(url, f"127.0.1.{n + 1}") as attacker:
                codes.append(attacker.get("/v1/models", headers=bearer(head + secrets.token_urlsafe(30))).status_code)
        assert codes == [401] * 5 + [429], codes
        with client_at(url, "127.0.2.1") as fresh:
            assert_throttled(fresh.get("/v1/models", headers=bearer(head + secrets.token_urlsafe(30))))
            # The key itself from an address it has not come from waits out the lock: that is
            # the price of not letting the guesser through.
            assert_throttled(fresh.get("/v1/models", headers=bearer(secret)))
            assert fresh.get("/v1/models", headers=bearer(wrong_key())).status_code == 401  # other prefixes
        with client_at(url, "127.0.0.8") as owner:
            assert owner.get("/v1/models", headers=bearer(secret)).status_code == 200


def test_the_sign_in_csrf_token_is_bound_to_the_servers_secret(tmp_path: Path) -> None:
    app, _ = make_app(tmp_path)
    with serve(app) as url, httpx.Client(base_url=url) as c:
        # The attacker sets both halves, as an unbound double submit would accept.
        c.cookies.set("kimi_console_login", "attacker-chosen")
        r = c.post("/console/login", data={"csrf": "attacker-chosen", "key": ADMIN_KEY})
        assert r.status_code == 400 and "expired" in r.text
        # A token another server made (another secret), with its own nonce in the cookie.
        c.cookies.clear()
        nonce, token = LoginTokens(secrets.token_bytes(32)).issue()
        c.cookies.set("kimi_console_login", nonce)
        assert c.post("/console/login", data={"csrf": token, "key": ADMIN_KEY}).status_code == 400
        # This server's token with its time changed, or with the cookie of a later form.
        c.cookies.clear()
        first = _CSRF.search(c.get("/console/login").text)
        assert first is not None
        head, issued, mac = first.group(1).split(".")
        moved = f"{head}.{int(issued) - 1}.{mac}"
        assert c.post("/console/login", data={"csrf": moved, "key": ADMIN_KEY}).status_code == 400
        assert c.post("/console/login", data={"csrf": first.group(1), "key": ADMIN_KEY}).status_code == 400
        assert sign_in(c, ADMIN_KEY).status_code == 303


def test_every_console_answer_carries_the_security_headers(tmp_path: Path) -> None:
    app, _ = make_app(tmp_path)
    paths = ("/console/login", "/console/static/console.js", "/console/keys", "/console/", "/console/nowhere")
    with serve(app) as url, httpx.Client(base_url=url) as c:
        answers = [c.get(path) for path in paths]
        answers.append(c.post("/console/login", data={"csrf": "x", "key": "y"}))
        assert sign_in(c, ADMIN_KEY).status_code == 303
        answers += [c.get(path) for path in paths]
    assert [r.status_code for r in answers] == [200, 200, 303, 303, 404, 400, 303, 200, 200, 303, 404]
    for r in answers:
        policy = r.headers["content-security-policy"]
        assert "script-src 'self';" in policy and "unsafe" not in policy and "frame-ancestors 'none'" in policy
        assert r.headers["x-content-type-options"] == "nosniff"
        assert r.headers["referrer-policy"] == "same-origin"
        assert r.headers["x-frame-options"] == "DENY"


def test_the_console_templates_have_no_inline_script_handler_or_style() -> None:
    # What the policy forbids would silently stop working in a browser; the browser test
    # (test_console_browser.py) watches for violations on the live pages as well.
    templates = Path(__file__).resolve().parent.parent / "src" / "kimi_server" / "console" / "templates"
    for page in templates.glob("*.html"):
        text = page.read_text()
        for tag in re.findall(r"<script\b[^>]*>", text):
            assert "src=" in tag or 'type="application/json"' in tag, (page.name, tag)
        assert not re.search(r"\son[a-z]+\s*=", text), page.name
        assert not re.search(r"\sstyle\s*=|<style\b|javascript:", text), page.name


@pytest.mark.integration
def test_two_instances_on_one_redis_throttle_as_one(tmp_path: Path) -> None:
    prefix = redis_prefix()
    with postgres_database() as db_url:
        shared: dict[str, Any] = {"database_url": db_url, "redis_url": REDIS_URL, "redis_prefix": prefix, **FAST}
        a, _ = make_app(tmp_path / "a", **shared)
        b, _ = make_app(tmp_path / "b", **shared)
        with serve(a) as url_a, serve(b) as url_b:
            with client_at(url_a, "127.0.0.9") as on_a, client_at(url_b, "127.0.0.9") as on_b:
                codes = [
                    (on_a if n % 2 else on_b).get("/admin/v1/keys", headers=bearer(f"sk-admin-guess-{n}")).status_code
                    for n in range(20)
                ]
                assert codes == [403] * 19 + [429], codes  # ten on each, one count
                assert_throttled(on_a.get("/admin/v1/keys", headers=ADMIN))
                assert_throttled(on_b.get("/admin/v1/keys", headers=ADMIN))
            with client_at(url_b, "127.0.0.10") as operator:
                assert operator.get("/admin/v1/keys", headers=ADMIN).status_code == 200
                metrics = operator.get("/metrics", headers=ADMIN).text
    # Each instance counts its own failures, and only one of them saw the lock start.
    assert 'kimi_auth_failures_total{surface="admin"} 10.0' in metrics
