"""The playground as a chat page, and the usage page's layout, in a real browser: headless
Chromium (Debian's) driven by Playwright, against the real app on a real socket with the
scripted engine (the model is not the point here: what the page keeps, sends and shows is).

The page must run under the console's Content-Security-Policy: any refusal fails the test."""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kimi_server.engines.scripted import Script, ScriptedEngine
from kimi_server.engines.types import GenerationRequest
from tests.files_samples import word
from tests.gateway_util import ADMIN_KEY, STATIC_KEY, chat_body, make_app, serve
from tests.media_samples import image

pytestmark = [pytest.mark.e2e, pytest.mark.browser]
CHROMIUM = "/usr/bin/chromium"
PRICES = {m: {"input": "0.6", "output": "2.5"} for m in ("kimi-k3", "kimi-k3.1-pro", "kimi-k3.1-pro-highspeed")}
LAST = "#conversation .turn.assistant:last-child"

if shutil.which(CHROMIUM) is None:  # scripts/test installs it; CI must not skip
    if os.environ.get("CI"):
        raise RuntimeError(f"{CHROMIUM} is missing: scripts/test installs Debian's chromium package")
    pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium)", allow_module_level=True)

from playwright.sync_api import Browser, BrowserContext, ConsoleMessage, Page, expect, sync_playwright  # noqa: E402


class Site:
    def __init__(self, url: str, engine: ScriptedEngine) -> None:
        self.url = url
        self.engine = engine

    def script(self, **fields: Any) -> None:
        """The next answers' script (the engine is shared by the module's tests)."""
        self.engine.script = Script(**fields)
        self.engine.requests.clear()


@pytest.fixture(scope="module")
def site() -> Iterator[Site]:
    engine = ScriptedEngine(images=True)
    with tempfile.TemporaryDirectory() as tmp:
        app, _ = make_app(Path(tmp), engine, prices=PRICES)
        with serve(app) as url:
            yield Site(url, engine)


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
    ctx = browser.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=True)
    ctx.set_default_timeout(20_000)
    try:
        yield ctx
    finally:
        ctx.close()


@pytest.fixture(autouse=True)
def csp_violations(context: BrowserContext) -> Iterator[list[str]]:
    refused: list[str] = []

    def note(message: ConsoleMessage) -> None:
        if "Content Security Policy" in message.text:
            refused.append(message.text)

    context.on("console", note)
    yield refused
    assert not refused, refused


def playground(site: Site, context: BrowserContext, model: str = "kimi-k3.1-pro") -> Page:
    page = context.new_page()
    page.goto(f"{site.url}/console/login")
    page.fill("input[name=key]", STATIC_KEY)
    page.click("button[type=submit]")
    expect(page).to_have_url(f"{site.url}/console/me")
    page.goto(f"{site.url}/console/playground")
    page.select_option("#model", model)
    return page


def say(page: Page, text: str, state: str = "done") -> None:
    page.fill("#message", text)
    page.click("#send")
    expect(page.locator("#output")).to_have_attribute("data-state", state)


def sent_bodies(page: Page) -> list[dict[str, Any]]:
    """What the page posts to /console/playground/send, as it posts it."""
    bodies: list[dict[str, Any]] = []

    def note(request: Any) -> None:
        if request.url.endswith("/console/playground/send"):
            bodies.append(json.loads(request.post_data or "{}"))

    page.on("request", note)
    return bodies


def said(request: GenerationRequest) -> list[tuple[str, str]]:
    return [(m.role, m.text) for m in request.messages]


def test_a_conversation_keeps_its_turns_regenerates_edits_and_exports(site: Site, context: BrowserContext) -> None:
    site.script(content=("Hello ", "**there**", ".\n\n- one\n- two\n\n```py\nprint('<b>')\n```"))
    answer = "Hello **there**.\n\n- one\n- two\n\n```py\nprint('<b>')\n```"
    page = playground(site, context)
    say(page, "first question")
    say(page, "second question")
    assert [said(r) for r in site.engine.requests] == [
        [("user", "first question")],
        [("user", "first question"), ("assistant", answer), ("user", "second question")],
    ]
    # The answer is drawn as markdown: bold, a list, a code block holding the text as it is.
    last = page.locator(LAST)
    expect(last.locator(".answer strong")).to_have_text("there")
    expect(last.locator(".answer li")).to_have_count(2)
    expect(last.locator(".answer pre code")).to_have_text("print('<b>')")

    # Regenerate: the last answer is asked again with the same turns before it.
    page.click(f"{LAST} .regenerate")
    expect(page.locator("#output")).to_have_attribute("data-state", "done")
    assert said(site.engine.requests[2]) == said(site.engine.requests[1])
    expect(page.locator("#conversation .turn")).to_have_count(4)

    # Edit the first turn: the turns after it are dropped, and the edited one is sent alone.
    page.click("#conversation .turn.user >> nth=0 >> .edit")
    expect(page.locator("#editing-note")).to_be_visible()
    expect(page.locator("#message")).to_have_value("first question")
    say(page, "first question, edited")
    assert said(site.engine.requests[3]) == [("user", "first question, edited")]
    expect(page.locator("#conversation .turn")).to_have_count(2)

    say(page, "and a follow-up")
    with page.expect_download() as download:
        page.click("#export")
    exported = json.loads(Path(download.value.path()).read_text())
    roles = [(t["role"], t["content"]) for t in exported["turns"]]
    assert roles == [
        ("user", "first question, edited"),
        ("assistant", answer),
        ("user", "and a follow-up"),
        ("assistant", answer),
    ]
    assert exported["turns"][1]["reasoning"] == "Let me think." and exported["turns"][1]["finish"] == "stop"
    assert exported["turns"][1]["usage"]["completion_tokens"] > 0
    assert exported["messages"][-1] == {"role": "assistant", "content": answer}
    assert exported["model"] == "kimi-k3.1-pro" and exported["endpoint"] == "chat"
    assert STATIC_KEY not in json.dumps(exported)

    page.click("#new-chat")
    expect(page.locator("#conversation .turn")).to_have_count(0)
    say(page, "fresh start")
    assert said(site.engine.requests[-1]) == [("user", "fresh start")]


def test_the_responses_endpoint_resends_each_answer_s_items(site: Site, context: BrowserContext) -> None:
    """The server keeps no response: the next request carries the earlier items themselves,
    the sealed reasoning included, which the server opens again into the prompt."""
    site.script()
    page = playground(site, context)
    bodies = sent_bodies(page)
    page.check("input[name=endpoint][value=responses]")
    say(page, "one")
    say(page, "two")
    first, second = (b["body"] for b in bodies)
    assert first["input"] == [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "one"}]}]
    types = [(item["type"], item.get("role")) for item in second["input"]]
    assert types == [("message", "user"), ("reasoning", None), ("message", "assistant"), ("message", "user")]
    assert second["input"][1]["encrypted_content"]
    assert "previous_response_id" not in second
    restored = site.engine.requests[1].messages[1]
    assert (restored.role, restored.text, restored.reasoning) == ("assistant", "Hello there.", "Let me think.")
    expect(page.locator(f"{LAST} .answer")).to_have_text("Hello there.")


def test_an_answer_streams_in_several_steps(site: Site, context: BrowserContext) -> None:
    """Each delta is drawn when it arrives: no part of the way (the console's relay, the
    page's stream reader) holds the answer back until its end."""
    site.script(content=("One ", "two ", "three ", "four."), delay=0.4)
    page = playground(site, context)
    page.evaluate("""() => {
        window.seen = [];
        new MutationObserver(() => {
            const answer = document.querySelector("#conversation .turn.assistant:last-child .answer");
            const state = document.getElementById("output").dataset.state;
            if (answer && answer.textContent && window.seen.at(-1)?.text !== answer.textContent)
                window.seen.push({text: answer.textContent, state});
        }).observe(document.getElementById("conversation"), {childList: true, characterData: true, subtree: true});
    }""")
    say(page, "count")
    seen = page.evaluate("window.seen")
    texts = [s["text"] for s in seen]
    assert texts[-1] == "One two three four."
    growing = [t for t, s in zip(texts, seen, strict=True) if s["state"] == "running"]
    assert len(growing) >= 3, seen  # drawn while the answer was still coming
    assert all(b.startswith(a) for a, b in itertools.pairwise(texts)), texts


@pytest.mark.parametrize("endpoint", ["chat", "responses"])
def test_an_answer_cut_by_the_output_limit_says_so(site: Site, context: BrowserContext, endpoint: str) -> None:
    """Two output tokens: the reasoning takes both, the answer is empty. The page says why
    rather than showing an empty box (chat: finish_reason length; Responses: incomplete)."""
    site.script()
    page = playground(site, context)
    page.check(f"input[name=endpoint][value={endpoint}]")
    page.fill("#max-tokens", "2")
    say(page, "hello")
    last = page.locator(LAST)
    expect(last).to_have_attribute("data-finish", "length" if endpoint == "chat" else "incomplete")
    words = last.locator(".stop-reason")
    expect(words).to_contain_text("reached the output limit (2 tokens)")
    expect(words).to_contain_text("before any answer")
    expect(last.locator(".answer")).to_have_text("")
    expect(last.locator(".reasoning")).to_have_text("Let me think.")


def test_an_error_a_refusal_and_a_stop_are_each_said(site: Site, context: BrowserContext) -> None:
    site.script(fail_after=3)  # fails after the reasoning and one piece of the answer
    page = playground(site, context)
    say(page, "break", state="failed")
    last = page.locator(LAST)
    expect(last).to_have_attribute("data-finish", "error")
    expect(last.locator(".error")).to_be_visible()
    expect(last.locator(".answer")).to_have_text("Hello")  # what came before the failure stays
    expect(last.locator(".regenerate")).to_be_visible()

    # A refusal comes from upstream models (this server writes none): an OpenAI-style stream
    # with a refusal delta, given to the page in place of the server's answer.
    refusal = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "refusal": "I can't help with that."}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    ]
    stream = "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in refusal) + "data: [DONE]\n\n"
    page.route(
        "**/console/playground/send",
        lambda route: route.fulfill(status=200, headers={"content-type": "text/event-stream"}, body=stream),
    )
    say(page, "something refused")
    expect(last).to_have_attribute("data-finish", "refusal")
    expect(last.locator(".refusal")).to_have_text("Refused: I can't help with that.")
    expect(last.locator(".stop-reason")).to_have_text("The model refused to answer.")
    page.unroute("**/console/playground/send")

    site.script(content=tuple(f"w{i} " for i in range(50)), delay=0.2)
    page.fill("#message", "go on and on")
    page.click("#send")
    expect(last.locator(".answer")).to_contain_text("w1")
    page.click("#stop")
    expect(page.locator("#output")).to_have_attribute("data-state", "stopped")
    expect(last.locator(".stop-reason")).to_have_text("Stopped by you.")
    assert "w49" not in last.locator(".answer").inner_text()


def test_markdown_never_runs_or_loads_what_the_model_wrote(site: Site, context: BrowserContext) -> None:
    hostile = (
        '<img src="/nothing" onerror="window.pwned = 1"> <script>window.pwned = 2</script> ',
        "[click](javascript:window.pwned=3) **still bold** [docs](https://example.com/x)",
    )
    site.script(content=hostile)
    page = playground(site, context)
    say(page, "be hostile")
    answer = page.locator(f"{LAST} .answer")
    expect(answer).to_contain_text('<img src="/nothing" onerror="window.pwned = 1">')
    expect(answer.locator("strong")).to_have_text("still bold")
    assert answer.locator("img, script, [onerror]").count() == 0
    links = answer.locator("a")
    expect(links).to_have_count(1)
    assert links.get_attribute("href") == "https://example.com/x"
    assert links.get_attribute("rel") == "noreferrer noopener"
    assert page.evaluate("window.pwned") is None


def test_an_image_goes_as_a_data_url_part(site: Site, context: BrowserContext, tmp_path: Path) -> None:
    site.script()
    picture = tmp_path / "red.png"
    picture.write_bytes(image("PNG"))
    page = playground(site, context)
    bodies = sent_bodies(page)
    page.set_input_files("#image", str(picture))
    expect(page.locator("#image-preview")).to_be_visible()
    say(page, "what colour is this?")
    (content,) = [m["content"] for m in bodies[0]["body"]["messages"] if m["role"] == "user"]
    assert content[0] == {"type": "text", "text": "what colour is this?"}
    url = content[1]["image_url"]["url"]
    assert url == "data:image/png;base64," + base64.b64encode(picture.read_bytes()).decode()
    assert site.engine.requests[0].messages[0].images  # the engine got it
    expect(page.locator("#conversation .turn.user img.thumb")).to_have_count(1)
    expect(page.locator("#image-preview")).to_be_hidden()  # the next message starts without it


def test_a_document_is_read_by_the_files_api_and_sent_as_a_system_message(
    site: Site, context: BrowserContext, tmp_path: Path
) -> None:
    """Kimi's long-document workflow from the page: the file is uploaded (purpose file-extract)
    as the signed-in key, and its extracted text goes in a system message before the
    conversation, on either endpoint, in the curl command and in the export."""
    site.script()
    notes = tmp_path / "notes.txt"
    text = "Field notes.\nThe courier's password is quindecillion-marmoset.\n"
    notes.write_text(text)
    brief = tmp_path / "brief.docx"
    brief.write_bytes(word(["Brief", "The meeting point is the ossuary-belvedere."]))
    page = playground(site, context)
    bodies = sent_bodies(page)

    page.set_input_files("#document", str(notes))
    chips = page.locator("#documents li")
    expect(chips).to_have_count(1)
    expect(chips.first.locator(".document-name")).to_have_text("notes.txt")
    expect(chips.first.locator(".document-size")).to_have_text(f"{len(text)} characters of text")
    say(page, "What is the courier's password?")
    messages = bodies[0]["body"]["messages"]
    assert [m["role"] for m in messages] == ["system", "user"]
    document = json.loads(messages[0]["content"])  # Kimi's content answer, as the API gave it
    assert document["filename"] == "notes.txt" and "quindecillion-marmoset" in document["content"]
    assert messages[1] == {"role": "user", "content": "What is the courier's password?"}
    (system, user) = said(site.engine.requests[0])
    assert system[0] == "system" and "quindecillion-marmoset" in system[1] and user[0] == "user"
    expect(page.locator("#curl")).to_contain_text("quindecillion-marmoset")

    # The file is the signed-in key's own, listed by the Files API.
    listed = httpx.get(f"{site.url}/v1/files", headers={"Authorization": f"Bearer {STATIC_KEY}"}).json()["data"]
    assert chips.first.get_attribute("data-file-id") in [f["id"] for f in listed]

    # A Word document as well, on Responses: both go as system items before the turns.
    page.check("input[name=endpoint][value=responses]")
    page.set_input_files("#document", str(brief))
    expect(chips).to_have_count(2)
    say(page, "And where do we meet?")
    items = bodies[1]["body"]["input"]
    assert [(i["type"], i.get("role")) for i in items[:2]] == [("message", "system"), ("message", "system")]
    texts = [json.loads(i["content"][0]["text"])["content"] for i in items[:2]]
    assert "quindecillion-marmoset" in texts[0] and "ossuary-belvedere" in texts[1]
    assert items[2] == {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "What is the courier's password?"}],
    }

    with page.expect_download() as download:
        page.click("#export")
    exported = json.loads(Path(download.value.path()).read_text())
    assert [d["filename"] for d in exported["documents"]] == ["notes.txt", "brief.docx"]
    assert [m["role"] for m in exported["messages"][:3]] == ["system", "system", "user"]
    assert "ossuary-belvedere" in exported["input"][1]["content"][0]["text"]

    # Remove takes it out of the conversation (the file stays the key's).
    chips.first.locator("button").click()
    expect(chips).to_have_count(1)
    say(page, "Once more?")
    systems = [i for i in bodies[2]["body"]["input"] if i.get("role") == "system"]
    assert len(systems) == 1 and "ossuary-belvedere" in systems[0]["content"][0]["text"]

    # A file the API cannot read: its message in the composer's error line, nothing attached.
    fake = tmp_path / "report.pdf"
    fake.write_bytes(b"this is no pdf")
    page.set_input_files("#document", str(fake))
    expect(page.locator("#composer-error")).to_have_text(
        "Could not attach report.pdf: The file is named .pdf but is not a PDF."
    )
    expect(chips).to_have_count(1)
    expect(page.locator("#send")).to_be_enabled()


def test_the_admin_attaches_a_document_with_the_key_it_pastes(
    site: Site, context: BrowserContext, tmp_path: Path
) -> None:
    notes = tmp_path / "admin-notes.txt"
    notes.write_text("Pasted-key document.\n")
    page = context.new_page()
    page.goto(f"{site.url}/console/login")
    page.fill("input[name=key]", ADMIN_KEY)
    page.click("button[type=submit]")
    page.goto(f"{site.url}/console/playground")
    page.set_input_files("#document", str(notes))  # no key pasted yet: the route says what to do
    expect(page.locator("#composer-error")).to_contain_text("paste one")
    page.fill("#api-key", STATIC_KEY)
    page.set_input_files("#document", str(notes))
    expect(page.locator("#documents li .document-name")).to_have_text("admin-notes.txt")
    expect(page.locator("#composer-error")).to_be_hidden()
    listed = httpx.get(f"{site.url}/v1/files", headers={"Authorization": f"Bearer {STATIC_KEY}"}).json()["data"]
    assert "admin-notes.txt" in [f["filename"] for f in listed]


@pytest.mark.parametrize("width", [1280, 1600])
def test_the_usage_tables_and_charts_fit_their_cards(site: Site, browser: Browser, width: int) -> None:
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    for name in ("web-frontend-production-eu-west-1", "batch-jobs-nightly-reindex", f"ci-{width}"):
        made = httpx.post(
            f"{site.url}/admin/v1/keys",
            headers=admin,
            json={
                "name": f"{name}-{width}",
                "budget_usd": "12345",
                "soft_budget_usd": "100",
                "budget_period": "monthly",
            },
        )
        assert made.status_code == 200, made.text
        key = made.json()["secret"]
        answered = httpx.post(
            f"{site.url}/v1/chat/completions", headers={"Authorization": f"Bearer {key}"}, json=chat_body()
        )
        assert answered.status_code == 200
    ctx = browser.new_context(viewport={"width": width, "height": 1000})
    try:
        page = ctx.new_page()
        page.goto(f"{site.url}/console/login")
        page.fill("input[name=key]", ADMIN_KEY)
        page.click("button[type=submit]")
        page.goto(f"{site.url}/console/usage?days=1")
        overflow = page.evaluate("""() => [...document.querySelectorAll("section.card")].map(card => ({
            title: card.querySelector("h2")?.textContent,
            over: card.scrollWidth - card.clientWidth}))""")
        assert all(c["over"] <= 0 for c in overflow), overflow
        assert any(c["title"] == "By key" for c in overflow)
        # Every label of every chart lies inside its chart (none cut at an edge), and a bar's
        # label never runs into its neighbour's.
        cut = page.evaluate("""() => [...document.querySelectorAll("svg.chart")].flatMap(svg => {
            const box = svg.viewBox.baseVal;
            return [...svg.querySelectorAll("text.axis")].map(t => t.getBBox())
                .filter(b => b.x < box.x || b.x + b.width > box.x + box.width).map(b => [svg.id, b.x, b.width]);
        })""")
        assert cut == []
        labels = page.evaluate("""() => [...document.querySelectorAll("#tokens-by-key > text.axis[text-anchor=middle]")]
            .map(t => { const b = t.getBBox(); return [b.x, b.x + b.width, t.textContent]; })""")
        assert len(labels) >= 3
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(labels)), labels
        assert any(text.endswith("…") for _, _, text in labels)  # a long name shortened, not cut
    finally:
        ctx.close()
