"""The Files API over HTTP with the real app (a scripted engine: the model is not the point here):
Kimi's shapes through the openai SDK and raw HTTP, files owned by the key that uploaded them,
names that are only labels, the limits and the errors that name them, ``ms://`` media parts,
and the extraction child's deadline and crash handling."""

from __future__ import annotations

import base64
import json
import os
import sys
from pathlib import Path
from typing import Any, cast

import anyio
import openai
import pytest
from fastapi.testclient import TestClient

from kimi_server.engines.scripted import ScriptedEngine
from kimi_server.errors import InvalidRequestError
from kimi_server.files.extract import Extractor
from kimi_server.files.limits import FileLimits
from tests.conftest import OTHER_KEY, TEST_KEY, ScriptedApp
from tests.files_samples import pdf, word
from tests.media_samples import image

FILES = "/v1/files"
OTHER = {"Authorization": f"Bearer {OTHER_KEY}"}
EXTRACT: Any = "file-extract"  # the SDK types purpose as OpenAI's own values; Kimi's pass through


def upload(c: TestClient, name: str, data: bytes, purpose: str = "file-extract", **kw: Any) -> Any:
    return c.post(FILES, files={"file": (name, data, "application/octet-stream")}, data={"purpose": purpose}, **kw)


def refused(r: Any, status: int, code: str, param: str | None = "file", *words: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    error: dict[str, Any] = r.json()["error"]
    assert set(error) >= {"message", "type", "code"} and error["code"] == code, error
    assert error.get("param") == param, error
    for word_ in words:
        assert word_ in error["message"], error
    return error


@pytest.fixture
def engine() -> ScriptedEngine:
    return ScriptedEngine(images=True)  # a vision-capable engine that records what it got


@pytest.fixture
def client(engine: ScriptedEngine, scripted_app: ScriptedApp) -> Any:
    with scripted_app(engine, keys=[TEST_KEY, OTHER_KEY]) as c:
        yield c


def sdk(c: TestClient, key: str = TEST_KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url="http://testserver/v1", api_key=key, http_client=c, max_retries=0)


def test_a_document_round_trips_through_the_sdk(client: TestClient, tmp_path: Path) -> None:
    path = tmp_path / "report.pdf"
    path.write_bytes(pdf([["The launch code is PURPLE-42."], ["Page two says hello."]], title="Report"))
    made = sdk(client).files.create(file=path, purpose=EXTRACT)  # as Kimi's own examples do
    assert (made.object, made.filename, made.purpose, made.status) == ("file", "report.pdf", "file-extract", "ok")
    assert made.bytes == path.stat().st_size and len(made.id) == 20
    content = json.loads(sdk(client).files.content(file_id=made.id).text)
    assert content["content"] == "The launch code is PURPLE-42.\n\nPage two says hello."
    assert (content["file_type"], content["filename"], content["title"], content["type"]) == (
        "application/pdf",
        "report.pdf",
        "Report",
        "file",
    )
    assert sdk(client).files.retrieve(made.id) == made
    listed = list(sdk(client).files.list())  # the SDK pages on until has_more is false
    assert [f.id for f in listed] == [made.id]
    deleted = sdk(client).files.delete(made.id)
    assert (deleted.id, deleted.deleted) == (made.id, True)
    with pytest.raises(openai.NotFoundError):
        sdk(client).files.retrieve(made.id)
    refused(client.get(f"{FILES}/{made.id}/content"), 404, "file_not_found", "file_id")


def test_word_html_and_text_are_read_and_listed_newest_first(client: TestClient) -> None:
    docx = upload(client, "notes.docx", word(["Alpha paragraph.", "Beta paragraph."], title="Notes")).json()
    page = b"<html><head><title> A page </title><style>p{}</style></head><body><p>Shown <b>text</b></p>"
    page += b"<script>hidden()</script><div>More</div></body></html>"
    html = upload(client, "page.html", page).json()
    text = upload(client, "readme.md", "# Title\n\n\u6c49\u5b57 and words".encode()).json()
    got = {f["id"]: client.get(f"{FILES}/{f['id']}/content").json() for f in (docx, html, text)}
    assert got[docx["id"]]["content"] == "Alpha paragraph.\n\nBeta paragraph.\n\ncell one | cell two"
    assert got[docx["id"]]["title"] == "Notes"
    assert (got[html["id"]]["content"], got[html["id"]]["title"]) == ("Shown text\nMore", "A page")
    assert (got[text["id"]]["content"], got[text["id"]]["file_type"]) == (
        "# Title\n\n\u6c49\u5b57 and words",
        "text/markdown",
    )
    listed = client.get(FILES).json()
    assert listed["object"] == "list" and listed["has_more"] is False
    assert {f["id"] for f in listed["data"]} == set(got)
    first = client.get(FILES, params={"limit": 2}).json()
    rest = client.get(FILES, params={"after": first["data"][-1]["id"]}).json()
    assert first["has_more"] is True and [f["id"] for f in first["data"] + rest["data"]] == [
        f["id"] for f in listed["data"]
    ]
    assert client.get(FILES, params={"purpose": "image"}).json()["data"] == []


def test_another_key_finds_none_of_them(client: TestClient) -> None:
    mine = upload(client, "secret.txt", b"for my eyes only").json()["id"]
    for method, path in (("GET", mine), ("GET", f"{mine}/content"), ("DELETE", mine)):
        refused(client.request(method, f"{FILES}/{path}", headers=OTHER), 404, "file_not_found", "file_id")
    assert client.get(FILES, headers=OTHER).json()["data"] == []
    assert client.get(f"{FILES}/{mine}").status_code == 200  # still there for its owner
    refused(client.get(FILES, headers={"Authorization": "Bearer nope"}), 401, "invalid_api_key", None)


@pytest.mark.parametrize("name", ["../../etc/passwd", "/etc/passwd", "a/b.txt", "..\\win.ini", ".."])
def test_a_name_that_is_a_path_is_refused_and_nothing_is_written_outside(
    client: TestClient, tmp_path: Path, name: str
) -> None:
    before = sorted(p for p in tmp_path.rglob("*") if "files" not in p.parts)
    refused(upload(client, name, b"text"), 400, "invalid_file_name", "file", "not a path")
    assert sorted(p for p in tmp_path.rglob("*") if "files" not in p.parts) == before
    assert not Path("/etc/passwd.kimi").exists()


def test_a_name_with_control_characters_is_refused(client: TestClient) -> None:
    # Written by hand: HTTP clients escape control characters in a part's file name.
    body = (
        b'--b\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nfile-extract\r\n'
        b'--b\r\nContent-Disposition: form-data; name="file"; filename="bell\x07.txt"\r\n\r\nx\r\n--b--\r\n'
    )
    r = client.post(FILES, content=body, headers={"Content-Type": "multipart/form-data; boundary=b"})
    refused(r, 400, "invalid_file_name", "file", "control characters")


def test_a_plain_odd_name_is_kept_as_a_label(client: TestClient, tmp_path: Path) -> None:
    name = "r\u00e9sum\u00e9 (final) ; rm -rf ~ .txt"
    made = upload(client, name, b"words").json()
    assert made["filename"] == name and client.get(f"{FILES}/{made['id']}/content").json()["filename"] == name
    stored = [p.name for p in tmp_path.rglob("*")]
    assert name not in stored and made["id"] in stored  # the server's id names the folder


def test_bad_purpose_missing_parts_and_unknown_ids(client: TestClient) -> None:
    refused(upload(client, "a.txt", b"x", purpose="fine-tune"), 400, "invalid_value", "purpose", "file-extract")
    refused(client.post(FILES, data={"purpose": "file-extract"}), 400, "invalid_request", "file")
    refused(client.post(FILES, files={"file": ("a.txt", b"x")}), 400, "invalid_request", "purpose")
    refused(client.post(FILES, json={"purpose": "file-extract"}), 400, "invalid_request", "file")
    refused(upload(client, "empty.txt", b""), 400, "empty_file")
    refused(client.get(f"{FILES}/../../etc/passwd"), 404, "not_found", None)
    refused(client.get(f"{FILES}/no-such-file"), 404, "file_not_found", "file_id")


def test_each_limit_is_refused_naming_its_setting(scripted_app: ScriptedApp, tmp_path: Path) -> None:
    settings: dict[str, Any] = {
        "max_body_bytes": 4096,
        "files_max_bytes": 60_000,
        "files_max_per_key": 2,
        "files_max_bytes_per_key": 100_000,
        "files_max_total_bytes": 100_000,
    }
    with scripted_app(keys=[TEST_KEY, OTHER_KEY], **settings) as c:
        # An upload larger than max_body_bytes is taken: uploads have their own limit.
        assert upload(c, "big.txt", b"a" * 50_000).status_code == 200
        refused(upload(c, "huge.txt", b"a" * 60_001), 413, "file_too_large", "file", "files_max_bytes")
        refused(upload(c, "over.txt", b"a" * 50_001), 413, "file_storage_quota", "file", "files_max_bytes_per_key")
        assert upload(c, "small.txt", b"a" * 10).status_code == 200
        refused(upload(c, "third.txt", b"a"), 400, "too_many_files", "file", "files_max_per_key")
        refused(
            upload(c, "all.txt", b"a" * 50_000, headers=OTHER),
            413,
            "file_storage_full",
            "file",
            "files_max_total_bytes",
        )
        assert upload(c, "fits.txt", b"a" * 40_000, headers=OTHER).status_code == 200
        # JSON bodies keep max_body_bytes.
        body = {"model": "kimi-k3.1-pro", "messages": [{"role": "user", "content": "x" * 5000}]}
        assert c.post("/v1/chat/completions", json=body).status_code == 413
        assert list((tmp_path / "data" / "files" / ".staging").iterdir()) == []  # refusals leave nothing


def test_ms_references_resolve_to_the_keys_own_uploads(client: TestClient, engine: ScriptedEngine) -> None:
    png = image("PNG")
    made = upload(client, "dot.png", png, purpose="image").json()
    assert made["purpose"] == "image"
    served = client.get(f"{FILES}/{made['id']}/content")
    assert served.content == png and served.headers["content-type"] == "image/png"
    chat: dict[str, Any] = {"model": "kimi-k3.1-pro", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": f"ms://{made['id']}"}},
    ]}]}  # fmt: skip
    assert client.post("/v1/chat/completions", json=chat).status_code == 200
    [seen] = engine.requests[-1].messages[0].images
    assert base64.b64decode(seen.split(",", 1)[1]) == png
    responses = {"model": "kimi-k3.1-pro", "input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": f"ms://{made['id']}"},
    ]}]}  # fmt: skip
    assert client.post("/v1/responses", json=responses).status_code == 200
    assert base64.b64decode(engine.requests[-1].messages[0].images[0].split(",", 1)[1]) == png
    # Another key's reference, a document's, an unknown one: 400s naming the part.
    where = "messages[0].content[1]"
    refused(client.post("/v1/chat/completions", json=chat, headers=OTHER), 400, "file_not_found", where)
    doc = upload(client, "a.txt", b"words").json()["id"]
    chat["messages"][0]["content"][1]["image_url"]["url"] = f"ms://{doc}"
    refused(client.post("/v1/chat/completions", json=chat), 400, "invalid_file_purpose", where, "'image'")
    chat["messages"][0]["content"][1]["image_url"]["url"] = "ms://../../etc/passwd"
    refused(client.post("/v1/chat/completions", json=chat), 400, "file_not_found", where)


def test_media_uploads_get_the_media_checks(client: TestClient) -> None:
    refused(upload(client, "fake.png", b"\x89PNG\r\n\x1a\nnot really", purpose="image"), 400, "invalid_media")
    refused(upload(client, "words.mp4", b"just words", purpose="video"), 400, "unsupported_media")
    refused(upload(client, "dot.png", image("PNG")), 400, "unsupported_file_type", "file", "purpose 'image'")


def _limits(timeout: float = 30.0, memory_mb: int = 256) -> FileLimits:
    return FileLimits(
        max_bytes=1 << 30,
        max_per_key=10,
        max_bytes_per_key=1 << 30,
        max_total_bytes=1 << 30,
        max_chars=100_000,
        max_pages=10,
        extract_timeout_s=timeout,
        extract_memory_bytes=memory_mb << 20,
        extract_concurrency=1,
    )


def _refusal(extractor: Extractor, path: Path) -> InvalidRequestError:
    async def run() -> InvalidRequestError:
        try:
            await extractor.extract(path, path.name)
        except InvalidRequestError as exc:
            return exc
        raise AssertionError("the extraction was not refused")

    return anyio.run(run)


def test_a_child_past_its_deadline_is_killed_and_refused(tmp_path: Path) -> None:
    doc = tmp_path / "slow.txt"
    doc.write_text("x")
    # Stands in for a file built to be slow: writes its pid, then never answers.
    hang = "import os, sys, time; open(sys.argv[1] + '.pid', 'w').write(str(os.getpid())); time.sleep(600)"
    error = _refusal(Extractor(_limits(timeout=2.0), command=(sys.executable, "-S", "-c", hang)), doc)
    assert error.code == "extraction_timeout" and "files_extract_timeout_s" in error.message
    pid = int(Path(f"{doc}.pid").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # killed and reaped, not left running


@pytest.mark.parametrize(
    "script",
    ["import os; os.abort()", "print('not json')", 'print(\'{"ok": false, "code": "rm -rf", "message": 1}\')'],
)
def test_a_child_that_crashes_or_babbles_is_a_plain_400(tmp_path: Path, script: str) -> None:
    doc = tmp_path / "a.txt"
    doc.write_text("x")
    error = _refusal(Extractor(_limits(), command=(sys.executable, "-c", script)), doc)
    assert error.status_code == 400 and error.code == "file_unreadable" and error.param == "file"


def test_a_file_that_needs_more_memory_than_allowed_is_refused(tmp_path: Path) -> None:
    doc = tmp_path / "big.txt"
    doc.write_bytes(b"word " * (16 << 20))  # 80 MiB of text: read and decoded, more than 128 MiB
    error = _refusal(Extractor(_limits(memory_mb=128)), doc)
    assert error.code == "file_too_complex" and "files_extract_memory_mb" in error.message


def test_the_openapi_document_lists_the_routes(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    assert set(paths[FILES]) == {"get", "post"}
    assert set(paths[f"{FILES}/{{file_id}}"]) == {"get", "delete"}
    content = paths[f"{FILES}/{{file_id}}/content"]["get"]["responses"]["200"]["content"]
    assert "application/json" in content and "image/*" in content
    upload_body = paths[FILES]["post"]["requestBody"]["content"]
    assert "multipart/form-data" in upload_body
    assert cast(dict[str, Any], paths[FILES]["post"]["responses"])["413"]
