"""The web console in a real browser: headless Chromium (Debian's) driven by Playwright, against
the real server process with the real tiny model, and the openai SDK for the API calls."""

from __future__ import annotations

import os
import secrets
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import LiveServer, start_server, stop_server

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

ADMIN_KEY = "sk-admin-console-test"
CHROMIUM = "/usr/bin/chromium"
SCREENSHOT = Path(__file__).resolve().parent.parent / "docs" / "images" / "console.png"
MODEL = "kimi-k3.1-pro"
PRICES = '{"kimi-k3.1-pro": {"input": "0.6", "cache_read": "0.15", "output": "2.5"}}'

if shutil.which(CHROMIUM) is None:  # scripts/test installs it; CI must not skip
    if os.environ.get("CI"):
        raise RuntimeError(f"{CHROMIUM} is missing: scripts/test installs Debian's chromium package")
    pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium)", allow_module_level=True)

from playwright.sync_api import Browser, BrowserContext, ConsoleMessage, Page, expect, sync_playwright  # noqa: E402


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    env = {"KIMI_THREADS": "1", "KIMI_PRICES": PRICES}
    proc, live = start_server(tmp_path_factory.mktemp("console"), "--admin-key", ADMIN_KEY, env=env)
    try:
        yield live
    finally:
        stop_server(proc)


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
    try:
        yield ctx
    finally:
        ctx.close()


@pytest.fixture(autouse=True)
def csp_violations(context: BrowserContext) -> Iterator[list[str]]:
    """What the browser refused under the console's Content-Security-Policy, on every page of
    a test: the console must work without inline script, handlers or style."""
    refused: list[str] = []

    def note(message: ConsoleMessage) -> None:
        if "Content Security Policy" in message.text:
            refused.append(message.text)

    context.on("console", note)
    yield refused
    assert not refused, refused


def origin(server: LiveServer) -> str:
    return server.base_url.removesuffix("/v1")


def sign_in(page: Page, server: LiveServer, key: str) -> None:
    page.goto(f"{origin(server)}/console/")
    expect(page).to_have_url(f"{origin(server)}/console/login")
    page.fill("input[name=key]", key)
    page.click("button[type=submit]")


def admin_api(server: LiveServer) -> httpx.Client:
    return httpx.Client(base_url=origin(server), headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=30)


def new_key(server: LiveServer, name: str, **limits: Any) -> dict[str, Any]:
    with admin_api(server) as c:
        r = c.post("/admin/v1/keys", json={"name": name, **limits})
        assert r.status_code == 200, r.text
        made: dict[str, Any] = r.json()
        return made


def ask(server: LiveServer, key: str, text: str = "Name a colour.") -> openai.types.chat.ChatCompletion:
    client = openai.OpenAI(base_url=server.base_url, api_key=key, max_retries=0, timeout=600)
    return client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": text}],
        reasoning_effort="low",
        max_completion_tokens=48,
    )


def test_root_points_to_the_console_and_the_api_stays_behind_keys(server: LiveServer, context: BrowserContext) -> None:
    page = context.new_page()
    page.goto(origin(server) + "/")
    expect(page).to_have_url(f"{origin(server)}/console/login")
    expect(page.locator("h1")).to_have_text("Sign in")
    # The console's own assets load without a key; the API does not.
    assert context.request.get(f"{origin(server)}/console/static/htmx.min.js").status == 200
    for path in ("/v1/models", "/v1/key/info", "/admin/v1/keys", "/console/keys"):
        assert httpx.get(origin(server) + path, follow_redirects=False).status_code in (401, 303), path


def test_admin_signs_in_and_a_wrong_key_is_refused(server: LiveServer, context: BrowserContext) -> None:
    page = context.new_page()
    sign_in(page, server, "sk-not-a-key")
    expect(page.locator("p.error")).to_contain_text("not valid")
    expect(page).to_have_url(f"{origin(server)}/console/login")
    assert not [c for c in context.cookies() if c["name"] == "kimi_console"]

    sign_in(page, server, ADMIN_KEY)
    expect(page).to_have_url(f"{origin(server)}/console/keys")
    expect(page.locator("#signed-in-as")).to_have_text("admin")
    (cookie,) = [c for c in context.cookies() if c["name"] == "kimi_console"]
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert ADMIN_KEY not in cookie["value"] and ADMIN_KEY not in page.url
    assert page.evaluate("document.cookie") == ""  # nothing of the session is readable by scripts

    page.click("form.signout button")
    expect(page).to_have_url(f"{origin(server)}/console/login")
    page.goto(f"{origin(server)}/console/keys")
    expect(page).to_have_url(f"{origin(server)}/console/login")


def test_a_key_is_created_used_and_revoked_from_the_console(server: LiveServer, context: BrowserContext) -> None:
    page = context.new_page()
    sign_in(page, server, ADMIN_KEY)
    name = "console-made-key-with-a-rather-long-name-" + secrets.token_hex(3)
    page.fill("#create-key input[name=name]", name)
    page.fill("#create-key input[name=rpm]", "30")
    page.fill("#create-key input[name=budget_usd]", "2")
    page.check(f"#create-key input[name=models][value='{MODEL}']")
    page.click("#create-key button[type=submit]")
    expect(page.locator("h1")).to_contain_text(name)
    secret = page.input_value("#secret")
    key_id = page.inner_text("#new-key-id")
    assert secret.startswith("sk-kimi-") and key_id.startswith("key_")
    page.click("button[data-copy='#secret']")
    expect(page.locator("button[data-copy='#secret']")).to_have_text("Copied")

    # The list shows the full id and name; the secret is nowhere but on that one page.
    page.goto(f"{origin(server)}/console/keys")
    row = page.locator(f"tr[data-key-id='{key_id}']")
    expect(row.locator("td.name")).to_have_text(name)
    expect(row.locator("a.mono")).to_have_text(key_id)
    assert secret not in page.content()

    answer = ask(server, secret)  # the new key works, through the SDK
    assert answer.choices[0].message.content is not None

    page.click(f"tr[data-key-id='{key_id}'] a.mono")
    page.fill("#edit-key input[name=rpm]", "45")
    page.click("#edit-key button[type=submit]")
    expect(page.locator("[role=status]")).to_have_text("Saved.")
    with admin_api(server) as c:
        assert c.get(f"/admin/v1/keys/{key_id}").json()["rpm"] == 45

    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#revoke-key button")
    expect(page.locator("#key-status")).to_have_text("revoked")
    deadline = time.monotonic() + 10  # revocation reaches every lookup within a second
    while True:
        try:
            ask(server, secret)
        except openai.AuthenticationError:
            break
        assert time.monotonic() < deadline, "the revoked key still works"
        time.sleep(0.3)


def test_a_tenant_key_sees_only_its_own_pages(server: LiveServer, context: BrowserContext) -> None:
    other = new_key(server, "someone-else-" + secrets.token_hex(3))
    mine = new_key(server, "tenant-" + secrets.token_hex(3), budget_usd="1", models=[MODEL])
    page = context.new_page()
    sign_in(page, server, mine["secret"])
    expect(page).to_have_url(f"{origin(server)}/console/me")
    expect(page.locator("#my-key-id")).to_have_text(mine["id"])
    expect(page.locator("nav")).not_to_contain_text("Keys")
    expect(page.locator("nav")).not_to_contain_text("Live")

    for path in ("/console/keys", f"/console/keys/{other['id']}", "/console/live", "/console/live/panel"):
        response = page.goto(origin(server) + path)
        assert response is not None and response.status == 403, path
        expect(page.locator("p.error")).to_contain_text("admin key")
        assert other["id"] not in page.content() and other["name"] not in page.content()

    # Asking for another key's usage by address still shows only this key's rows.
    page.goto(f"{origin(server)}/console/usage?key={other['id']}")
    assert other["id"] not in page.content()
    expect(page.locator("#my-budget .meter")).to_have_attribute("data-budget", "1")
    # Its forms cannot act as the admin: a forged create is refused.
    forged = context.request.post(f"{origin(server)}/console/keys", form={"name": "x", "csrf": "x"})
    assert forged.status == 403


def test_the_playground_streams_an_answer_with_its_reasoning_apart(server: LiveServer, context: BrowserContext) -> None:
    page = context.new_page()
    sign_in(page, server, server.key)  # a static API key
    page.goto(f"{origin(server)}/console/playground")
    page.select_option("#model", MODEL)
    page.select_option("#effort", "low")
    page.fill("#max-tokens", "40")
    page.fill("#message", "Name two fruits.")
    # Count the updates each pane gets: a streamed reasoning arrives in many pieces. (The
    # answer is the attempt the reasoning settled on: it comes when that is decided.)
    page.evaluate("""() => {
        window.updates = {reasoning: 0, answer: 0};
        new MutationObserver((records) => {
            for (const r of records) {
                const node = r.target.nodeType === 1 ? r.target : r.target.parentElement;
                const pane = node.closest(".reasoning, .answer");
                if (pane) window.updates[pane.classList.contains("reasoning") ? "reasoning" : "answer"] += 1;
            }
        }).observe(document.getElementById("conversation"), {childList: true, characterData: true, subtree: true});
    }""")
    page.click("#send")
    expect(page.locator("#output")).to_have_attribute("data-state", "done", timeout=300_000)
    last = page.locator("#conversation .turn.assistant:last-child")
    reasoning = last.locator(".reasoning").inner_text().strip()
    answer = last.locator(".answer").inner_text().strip()
    # Both panes filled. Their texts may be equal: a first attempt that reaches the effort's floor
    # is the only one, and it is itself the answer (seen once with the tiny model).
    assert reasoning and answer
    updates = page.evaluate("window.updates")
    assert updates["reasoning"] > 1 and updates["answer"] >= 1, updates
    assert last.locator(".error").is_hidden()
    curl = page.text_content("#curl") or ""  # in a closed <details>: its text, not what shows
    assert "/v1/chat/completions" in curl and "$KIMI_API_KEY" in curl and server.key not in curl
    assert '"stream": true' in curl and '"reasoning_effort": "low"' in curl
    expect(last.locator(".usage")).to_contain_text("reasoning")

    # The Responses endpoint, in the same conversation: its reasoning summary apart from the
    # output text, and the first turn's items sent back with the second question.
    page.check("input[name=endpoint][value=responses]")
    page.fill("#message", "And one more.")
    page.click("#send")
    expect(page.locator("#output")).to_have_attribute("data-state", "done", timeout=300_000)
    assert last.locator(".answer").inner_text().strip() and last.locator(".reasoning").inner_text().strip()
    assert last.locator(".error").is_hidden()
    expect(page.locator("#conversation .turn")).to_have_count(4)
    curl = page.text_content("#curl") or ""
    assert "/v1/responses" in curl and "Name two fruits." in curl


def test_the_usage_chart_shows_requests_just_made(server: LiveServer, context: BrowserContext, tmp_path: Path) -> None:
    keys = [
        new_key(server, name, budget_usd=budget, models=[MODEL])
        for name, budget in (("web-frontend", "5"), ("batch-jobs", "0.001"), ("ci-smoke-tests", "20"))
    ]
    for key, times in zip(keys, (2, 1, 1), strict=True):
        for _ in range(times):
            ask(server, key["secret"])
    page = context.new_page()
    sign_in(page, server, ADMIN_KEY)

    page.goto(f"{origin(server)}/console/usage?key={keys[0]['id']}&days=1")
    bars = page.locator("#tokens-by-day g.bar")
    expect(bars).to_have_count(1)
    assert bars.first.get_attribute("data-requests") == "2"
    assert float(bars.first.get_attribute("data-total") or 0) > 0
    row = page.locator("#usage-by-model tr[data-row='kimi-k3.1-pro']")
    expect(row.locator("td[data-col=requests]")).to_have_text("2")
    assert int(row.locator("td[data-col=reasoning_tokens]").inner_text()) > 0

    # Every key: the day's bar counts them all, and spend shows against each budget.
    page.goto(f"{origin(server)}/console/usage?days=1")
    total = int(page.locator("#tokens-by-day g.bar").first.get_attribute("data-requests") or 0)
    assert total >= 4
    for key in keys:
        expect(page.locator(f"#usage-by-key tr[data-row='{key['id']}'] .meter")).to_have_count(1)
    page.set_viewport_size({"width": 1280, "height": 1060})
    # README shows this page: refreshed in docs/ only when asked, so a test run leaves the tree clean.
    shot = SCREENSHOT if os.environ.get("UPDATE_SCREENSHOTS") == "1" else tmp_path / "console.png"
    page.screenshot(path=str(shot), full_page=False)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000


def test_the_console_runs_under_its_content_security_policy(
    server: LiveServer, context: BrowserContext, csp_violations: list[str]
) -> None:
    page = context.new_page()
    sign_in(page, server, ADMIN_KEY)
    response = page.goto(f"{origin(server)}/console/live")
    assert response is not None
    headers = response.headers
    assert "script-src 'self'" in headers["content-security-policy"] and headers["x-content-type-options"] == "nosniff"
    assert headers["referrer-policy"] == "same-origin"
    # htmx (a file) runs: the panel is fetched again on its timer, and the deep check on a click.
    with page.expect_response(lambda r: r.url.endswith("/console/live/panel") and r.status == 200, timeout=15_000):
        pass
    page.click("button[hx-get='/console/live/health']")
    expect(page.locator("#deep-health")).not_to_be_empty(timeout=120_000)
    # Script written into the page is not run, and the browser says why.
    ran = page.evaluate(
        """() => { const s = document.createElement("script"); s.textContent = "window.injected = 1";
                   document.body.append(s); return window.injected === 1; }"""
    )
    assert ran is False
    deadline = time.monotonic() + 10  # the console message of the refusal is on its way
    while not any("inline script" in text for text in csp_violations):
        assert time.monotonic() < deadline, csp_violations
        page.wait_for_timeout(50)
    csp_violations.clear()  # that one was meant
