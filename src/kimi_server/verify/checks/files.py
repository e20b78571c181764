"""The Files API as Kimi's long-document workflow uses it: a text file uploaded with purpose
``file-extract`` (the ``openai`` SDK), its text read back from ``/files/{id}/content`` in Kimi's
shape, listed, looked up and deleted (then a 404); invisible to another key (with
``--other-key``); an unreadable file refused naming it; an uploaded image named ``ms://<id>`` in
an image part. An endpoint without ``/files`` skips the group."""

from __future__ import annotations

import json
import secrets
from typing import Any

import httpx
import openai

from kimi_server.verify.checks.media import png
from kimi_server.verify.outcome import Skipped, expect
from kimi_server.verify.registry import check
from kimi_server.verify.target import Target, error_shape, error_text

EXTRACT: Any = "file-extract"  # the SDK types purpose as OpenAI's own values; Kimi's pass through


def _upload(t: Target, name: str, data: bytes, purpose: str, key: str | None = None) -> httpx.Response:
    resp = t.http.post(
        t.base_url + "/files",
        files={"file": (name, data, "application/octet-stream")},
        data={"purpose": purpose},
        headers={"Authorization": f"Bearer {key or t.key}"},
    )
    if resp.status_code in (404, 405):
        raise Skipped(f"the endpoint has no Files API (POST /files: HTTP {resp.status_code})")
    return resp


def _uploaded(t: Target, name: str, data: bytes, purpose: str = "file-extract") -> str:
    resp = _upload(t, name, data, purpose)
    expect(resp.status_code == 200, f"upload: HTTP {resp.status_code}: {error_text(resp)}")
    file_id = resp.json().get("id")
    expect(isinstance(file_id, str) and bool(file_id), "the uploaded file has no id")
    return str(file_id)


def _delete(t: Target, file_id: str) -> None:
    t.http.delete(f"{t.base_url}/files/{file_id}", headers={"Authorization": f"Bearer {t.key}"})


@check("files", "upload, read back, list, delete")
def round_trip(t: Target, model: str) -> str:
    word = f"verify-{secrets.token_hex(4)}"
    try:
        made = t.sdk.files.create(file=("verify.txt", f"The password is {word}.".encode()), purpose=EXTRACT)
    except openai.NotFoundError:
        raise Skipped("the endpoint has no Files API (POST /files: HTTP 404)") from None
    try:
        purpose: str = made.purpose  # Kimi's purposes are not among the SDK's own
        expect(made.object == "file" and purpose == "file-extract", f"unexpected file object: {made}")
        expect(made.filename == "verify.txt", f"filename {made.filename!r}, not 'verify.txt'")
        content = json.loads(t.sdk.files.content(file_id=made.id).text)
        expect(isinstance(content, dict) and word in str(content.get("content")), "the text did not come back")
        missing = [k for k in ("content", "file_type", "filename", "title", "type") if k not in content]
        expect(not missing, f"the content answer lacks {', '.join(missing)}")
        expect(made.id in {f.id for f in t.sdk.files.list()}, "the file is not listed")
        expect(t.sdk.files.retrieve(made.id).id == made.id, "the file cannot be looked up")
    finally:
        deleted = t.sdk.files.delete(made.id)
    expect(deleted.deleted is True and deleted.id == made.id, f"unexpected delete answer: {deleted}")
    gone = t.http.get(f"{t.base_url}/files/{made.id}", headers={"Authorization": f"Bearer {t.key}"})
    expect(gone.status_code == 404, f"a deleted file: HTTP {gone.status_code} (404 expected)")
    error_shape(gone)
    return f"{content.get('file_type')}, {len(str(content.get('content')))} characters"


@check("files", "another key cannot see a file")
def isolation(t: Target, model: str) -> None:
    if not t.other_key:
        raise Skipped("give a second key with --other-key to check")
    file_id = _uploaded(t, "private.txt", b"Only for the key that uploaded it.")
    try:
        other = {"Authorization": f"Bearer {t.other_key}"}
        for method, path in (("GET", file_id), ("GET", f"{file_id}/content"), ("DELETE", file_id)):
            resp = t.http.request(method, f"{t.base_url}/files/{path}", headers=other)
            expect(resp.status_code == 404, f"another key's {method} /files/{path}: HTTP {resp.status_code}")
            error_shape(resp)
        listed = t.http.get(t.base_url + "/files", headers=other).json().get("data", [])
        expect(file_id not in {f.get("id") for f in listed}, "another key's list shows the file")
    finally:
        _delete(t, file_id)


@check("files", "unreadable file refused")
def unreadable(t: Target, model: str) -> None:
    resp = _upload(t, "broken.pdf", secrets.token_bytes(4096), "file-extract")
    if resp.status_code == 200:
        _delete(t, str(resp.json().get("id")))
    expect(resp.status_code == 400, f"random bytes named .pdf: HTTP {resp.status_code} (400 expected)")
    error = error_shape(resp)
    expect("file" in f"{error.get('param')} {error['message']}", "the refusal does not name the file")


@check("files", "ms:// image answered or refused")
def image_reference(t: Target, model: str) -> str:
    resp = _upload(t, "red.png", png(), "image")
    if resp.status_code == 400:
        raise Skipped(f"the endpoint takes no image uploads: {error_text(resp)}")
    expect(resp.status_code == 200, f"upload: HTTP {resp.status_code}: {error_text(resp)}")
    file_id = str(resp.json().get("id"))
    try:
        served = t.http.get(f"{t.base_url}/files/{file_id}/content", headers={"Authorization": f"Bearer {t.key}"})
        expect(served.content == png(), "the image's content is not the bytes uploaded")
        part = {"type": "image_url", "image_url": {"url": f"ms://{file_id}"}}
        content = [part, {"type": "text", "text": "What colour is this?"}]
        body = {"model": model, "messages": [{"role": "user", "content": content}], "max_completion_tokens": 64}
        answer = t.post("/chat/completions", {**body, **t.low_effort(model)})
    finally:
        _delete(t, file_id)
    if answer.status_code == 200:
        return "answered"
    expect(answer.status_code == 400, f"HTTP {answer.status_code} (an answer or a 400 expected)")
    error = error_shape(answer)
    expect("messages[0].content[0]" in f"{error.get('param')} {error['message']}", "the refusal does not name the part")
    return f"refused: {error['message']}"
