"""The request log, the audit trail and teams in a real browser: headless Chromium (Debian's)
driven by Playwright, against the app on a real socket with the scripted engine (the model is
not the point here), and the openai SDK for the API calls. Every page runs under the console's
Content-Security-Policy: any violation fails the test."""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from kimi_server.engines.scripted import Script, ScriptedEngine
from tests.gateway_util import ADMIN_KEY, make_app, serve

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

CHROMIUM = "/usr/bin/chromium"
MODEL = "kimi-k3"
PRICES = {MODEL: {"input": "100", "output": "100"}}  # the scripted answer costs 0.0016 USD

if shutil.which(CHROMIUM) is None:  # scripts/test installs it; CI must not skip
    if os.environ.get("CI"):
        raise RuntimeError(f"{CHROMIUM} is missing: scripts/test installs Debian's chromium package")
    pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium)", allow_module_level=True)

from playwright.sync_api import Browser, BrowserContext, ConsoleMessage, Page, expect, sync_playwright  # noqa: E402


@pytest.fixture(scope="module")
def engine() -> ScriptedEngine:
    return ScriptedEngine()


@pytest.fixture(scope="module")
def origin(tmp_path_factory: pytest.TempPathFactory, engine: ScriptedEngine) -> Iterator[str]:
    app, _ = make_app(tmp_path_factory.mktemp("ops-console"), engine, prices=PRICES)
    with serve(app) as url:
        yield url


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def context(browser: Browser) -> Iterator[BrowserContext]:
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    ctx.set_default_timeout(30_000)
    refused: list[str] = []

    def note(message: ConsoleMessage) -> None:
        if "Content Security Policy" in message.text:
            refused.append(message.text)

    ctx.on("console", note)
    try:
        yield ctx
    finally:
        ctx.close()
    assert not refused, refused


def signed_in(context: BrowserContext, origin: str) -> Page:
    page = context.new_page()
    page.goto(f"{origin}/console/login")
    page.fill("input[name=key]", ADMIN_KEY)
    page.click("button[type=submit]")
    expect(page).to_have_url(f"{origin}/console/keys")
    return page


def new_key(origin: str, name: str, **fields: Any) -> dict[str, Any]:
    r = httpx.post(
        f"{origin}/admin/v1/keys", json={"name": name, **fields}, headers={"Authorization": f"Bearer {ADMIN_KEY}"}
    )
    assert r.status_code == 200, r.text
    made: dict[str, Any] = r.json()
    return made


def ask(origin: str, secret: str) -> openai.types.chat.ChatCompletion:
    client = openai.OpenAI(base_url=f"{origin}/v1", api_key=secret, max_retries=0, timeout=60)
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=8)


def test_a_request_is_found_by_key_and_status_and_its_page_shows_timings_and_cost(
    context: BrowserContext, origin: str, engine: ScriptedEngine
) -> None:
    web = new_key(origin, "web-" + secrets.token_hex(3), capture=True)
    other = new_key(origin, "batch-" + secrets.token_hex(3))
    ask(origin, web["secret"])
    ask(origin, other["secret"])
    engine.script = Script(fail_after=1)
    try:
        with pytest.raises(openai.InternalServerError):
            ask(origin, web["secret"])
    finally:
        engine.script = Script()

    page = signed_in(context, origin)
    page.click("nav a[href='/console/requests']")
    page.select_option("#request-filters select[name=key]", web["id"])
    page.select_option("#request-filters select[name=status]", "completed")
    page.click("#request-filters button[type=submit]")
    rows = page.locator("#requests tbody tr[data-request-id]")
    expect(rows).to_have_count(1)
    expect(rows.first.locator("td[data-key-id]")).to_have_attribute("data-key-id", web["id"])
    expect(rows.first).to_have_attribute("data-status", "completed")

    page.select_option("#request-filters select[name=status]", "failed")
    page.click("#request-filters button[type=submit]")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("internal_error")
    page.select_option("#request-filters select[name=status]", "completed")
    page.click("#request-filters button[type=submit]")

    rows.first.locator("a.mono").click()
    expect(page.locator("#request-status")).to_have_text("completed")
    expect(page.locator("#cost")).to_have_text("0.0016 USD")
    expect(page.locator("#ttft")).to_contain_text(" ms")
    expect(page.locator("#duration")).to_contain_text(" ms")
    expect(page.locator("#ending")).to_have_text("stop")
    expect(page.locator("#captured-answer")).to_have_text("Hello there.")  # the key captures


def test_a_key_created_and_rotated_from_the_console_is_in_the_audit_trail(context: BrowserContext, origin: str) -> None:
    page = signed_in(context, origin)
    name = "rotated-" + secrets.token_hex(3)
    page.fill("#create-key input[name=name]", name)
    page.click("#create-key button[type=submit]")
    key_id = page.inner_text("#new-key-id")
    first_secret = page.input_value("#secret")

    page.goto(f"{origin}/console/keys/{key_id}")
    page.fill("#rotate-key input[name=grace_seconds]", "120")
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#rotate-key button[type=submit]")
    expect(page.locator("h1")).to_contain_text("Key rotated")
    expect(page.locator("#grace-ends")).not_to_be_empty()
    assert page.inner_text("#new-key-id") == key_id and page.input_value("#secret") != first_secret
    ask(origin, first_secret)  # still accepted, within its grace

    page.click("nav a[href='/console/audit']")
    entries = page.locator(f"#audit tr[data-target='{key_id}']")
    expect(entries).to_have_count(2)
    expect(entries.nth(0)).to_have_attribute("data-action", "key.rotate")
    expect(entries.nth(1)).to_have_attribute("data-action", "key.create")
    for i in range(2):
        expect(entries.nth(i).locator("td.who")).to_have_text("console session (admin key)")
    expect(entries.nth(0).locator("td.details")).to_contain_text("grace seconds: 120")
    assert first_secret not in page.content()
    expect(page.locator("#audit tr[data-action='console.sign_in']").first).to_be_visible()


def test_a_team_budget_stops_its_second_key(context: BrowserContext, origin: str) -> None:
    page = signed_in(context, origin)
    page.click("nav a[href='/console/teams']")
    team = "team-" + secrets.token_hex(3)
    page.fill("#create-team input[name=name]", team)
    page.fill("#create-team input[name=budget_usd]", "0.001")
    page.check(f"#create-team input[name=models][value='{MODEL}']")
    page.click("#create-team button[type=submit]")
    expect(page.locator("h1")).to_have_text(team)
    team_id = page.inner_text("#team-id")

    made = []
    for n in range(2):
        page.goto(f"{origin}/console/keys")
        page.fill("#create-key input[name=name]", f"{team}-key-{n}")
        page.select_option("#create-key select[name=team]", team_id)
        page.click("#create-key button[type=submit]")
        made.append((page.inner_text("#new-key-id"), page.input_value("#secret")))

    assert ask(origin, made[0][1]).choices[0].message.content == "Hello there."
    with pytest.raises(openai.RateLimitError) as refused:
        ask(origin, made[1][1])
    assert refused.value.code == "insufficient_quota" and "team's budget" in str(refused.value)

    page.goto(f"{origin}/console/teams/{team_id}")
    expect(page.locator("#team-spend .meter")).to_have_class("meter over")
    expect(page.locator("#team-spend .meter")).to_have_attribute("data-spent", "0.0016")
    for key_id, _ in made:
        expect(page.locator(f"#team-keys tr[data-key-id='{key_id}']")).to_have_count(1)
    page.click("a[href^='/console/requests?team=']")
    rows = page.locator("#requests tbody tr[data-request-id]")
    expect(rows).to_have_count(1)
    expect(rows.first.locator("td[data-key-id]")).to_have_attribute("data-key-id", made[0][0])
