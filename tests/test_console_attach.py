"""The playground's document route over real HTTP (uvicorn on a socket, the scripted engine,
SQLite): a file attached from the console goes through the Files API as the sending key, so it
is that key's own file, read under the API's limits, and refused with the API's own errors.
The page's side is in test_console_chat_browser.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.files_samples import word
from tests.gateway_util import ADMIN_KEY, STATIC_KEY, make_app, serve
from tests.test_console import make_key, signed_in

ROUTE = "/console/playground/files"
WORD = "quindecillion-marmoset"
NOTE = {"file": ("notes.txt", f"Field notes.\nThe courier's password is {WORD}.\n".encode(), "text/plain")}


@pytest.fixture
def url(tmp_path: Path) -> Iterator[str]:
    app, _ = make_app(tmp_path)
    with serve(app) as base:
        yield base


def ids_of(url: str, key: str) -> list[str]:
    """The ids of the files ``key`` sees through the Files API."""
    r = httpx.get(f"{url}/v1/files", headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 200, r.text
    return [f["id"] for f in r.json()["data"]]


def refused(r: httpx.Response, status: int, param: str | None, *words: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    error: dict[str, Any] = r.json()["error"]
    assert error.get("param") == param, error
    for word_ in words:
        assert word_ in error["message"], error
    return error


def test_a_document_is_read_by_the_files_api_as_the_signed_in_key(url: str) -> None:
    other = make_key(url, "someone-else")
    with signed_in(url, STATIC_KEY) as (c, csrf):
        refused(c.post(ROUTE, files=NOTE), 403, None, "reload")  # no CSRF header
        assert ids_of(url, STATIC_KEY) == []

        r = c.post(ROUTE, files=NOTE, headers={"x-csrf-token": csrf})
        assert r.status_code == 200, r.text
        answer = r.json()
        assert answer["file"]["purpose"] == "file-extract" and answer["file"]["filename"] == "notes.txt"
        # Kimi's content answer, as GET /v1/files/{id}/content gives it to the key.
        assert answer["content"]["content"] == f"Field notes.\nThe courier's password is {WORD}.\n"
        assert {k: answer["content"][k] for k in ("filename", "type")} == {"filename": "notes.txt", "type": "file"}
        assert answer["file"]["id"] in ids_of(url, STATIC_KEY)
        assert ids_of(url, other["secret"]) == []  # the key's own, as any upload

        # A Word document, under a name that needs quoting in the form passed on: kept as a
        # direct upload keeps it.
        name = 'brief "v2" é.docx'
        docx = {"file": (name, word(["Summary", f"The answer is {WORD}."]), "application/octet-stream")}
        r = c.post(ROUTE, files=docx, headers={"x-csrf-token": csrf})
        assert r.status_code == 200, r.text
        assert WORD in r.json()["content"]["content"]
        direct = httpx.post(
            f"{url}/v1/files",
            files=docx,
            data={"purpose": "file-extract"},
            headers={"Authorization": f"Bearer {other['secret']}"},
        )
        assert r.json()["file"]["filename"] == direct.json()["filename"]
        assert "é" in direct.json()["filename"]
        # A name that is a path is the API's refusal, as it would be sent directly.
        pathlike = {"file": ("dir\\notes.txt", b"text", "text/plain")}
        refused(c.post(ROUTE, files=pathlike, headers={"x-csrf-token": csrf}), 400, "file", "bare name")

        # A document larger than one piece of the relay (1 MiB), spooled to disk on the way
        # (two bytes a character, to stay under files_max_chars).
        long = "ééééééééé\n".encode() * 60_000 + f"at the end: {WORD}\n".encode()
        r = c.post(ROUTE, files={"file": ("long.txt", long, "text/plain")}, headers={"x-csrf-token": csrf})
        assert r.status_code == 200, r.text
        assert r.json()["file"]["bytes"] == len(long) and r.json()["content"]["content"].endswith(f"{WORD}\n")

        # The API's own refusals, passed on: a file that is not what its name says, an empty one.
        fake = {"file": ("report.pdf", b"not a pdf at all", "application/pdf")}
        error = refused(c.post(ROUTE, files=fake, headers={"x-csrf-token": csrf}), 400, "file", "not a PDF")
        assert error["code"] == "file_unreadable"
        empty = {"file": ("empty.txt", b"", "text/plain")}
        refused(c.post(ROUTE, files=empty, headers={"x-csrf-token": csrf}), 400, "file", "empty")
        # No file at all: the console's own 400, naming the field.
        refused(c.post(ROUTE, data={"note": "x"}, headers={"x-csrf-token": csrf}), 400, "file", "Choose a file")
        assert len(ids_of(url, STATIC_KEY)) == 3  # the refused ones were never kept

    with signed_in(url, ADMIN_KEY) as (admin, admin_csrf):  # the admin key is no API key: the admin pastes one
        refused(admin.post(ROUTE, files=NOTE, headers={"x-csrf-token": admin_csrf}), 400, "key", "paste one")
        r = admin.post(ROUTE, files=NOTE, data={"key": "sk-nope"}, headers={"x-csrf-token": admin_csrf})
        assert r.status_code == 401
        r = admin.post(ROUTE, files=NOTE, data={"key": other["secret"]}, headers={"x-csrf-token": admin_csrf})
        assert r.status_code == 200, r.text
        assert r.json()["file"]["id"] in ids_of(url, other["secret"])  # owned by the key it was sent with
        assert r.json()["file"]["id"] not in ids_of(url, STATIC_KEY)


def test_a_document_over_the_files_limit_is_refused_with_the_apis_message(tmp_path: Path) -> None:
    app, _ = make_app(tmp_path, files_max_bytes=2048)
    with serve(app) as url, signed_in(url, STATIC_KEY) as (c, csrf):
        big = {"file": ("big.txt", b"x" * 4096, "text/plain")}
        error = refused(c.post(ROUTE, files=big, headers={"x-csrf-token": csrf}), 413, "file", "files_max_bytes")
        assert error["code"] == "file_too_large"
        assert c.post(ROUTE, files=NOTE, headers={"x-csrf-token": csrf}).status_code == 200
