"""``/docs`` in a real browser (Debian's headless Chromium through Playwright) against the real
server process: the page asks for the key, Swagger UI renders from the package's own files with no
request leaving the server, the key lands in Authorize and "Try it out" answers 200."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import LiveServer, start_server, stop_server

pytestmark = [pytest.mark.e2e, pytest.mark.browser]
CHROMIUM = "/usr/bin/chromium"

if shutil.which(CHROMIUM) is None:  # scripts/test installs it; CI must not skip
    if os.environ.get("CI"):
        raise RuntimeError(f"{CHROMIUM} is missing: scripts/test installs Debian's chromium package")
    pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium)", allow_module_level=True)

from playwright.sync_api import expect, sync_playwright  # noqa: E402


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    proc, live = start_server(tmp_path, env={"KIMI_TEST_ENGINE": "scripted"})
    try:
        yield live
    finally:
        stop_server(proc)


def test_docs_page_signs_in_authorizes_and_tries_a_route(server: LiveServer) -> None:
    origin = server.base_url.removesuffix("/v1")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            page = browser.new_page()
            page.set_default_timeout(30_000)
            requested: list[str] = []
            page.on("request", lambda request: requested.append(request.url))
            page.goto(f"{origin}/docs")
            expect(page.locator("#key-form")).to_be_visible()  # the document needs the key
            page.fill("#key-input", "sk-wrong")
            page.click("#key-form button[type=submit]")
            expect(page.locator("#key-note")).to_contain_text("refused (401)")
            page.fill("#key-input", server.key)
            page.click("#key-form button[type=submit]")
            expect(page.locator(".swagger-ui .info .title")).to_contain_text("kimi-server")
            expect(page.locator(".swagger-ui .btn.authorize")).to_be_visible()
            authorized = page.evaluate("() => Object.keys(window.ui.authSelectors.authorized().toJS())")
            assert authorized == ["APIKey"]
            page.click('.opblock-summary-path[data-path="/v1/models"]')
            page.click(".try-out__btn")
            page.click("button.execute")
            expect(page.locator(".live-responses-table tr.response .response-col_status")).to_have_text("200")
            assert requested and all(url.startswith(origin) for url in requested), requested
        finally:
            browser.close()
