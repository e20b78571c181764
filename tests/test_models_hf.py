"""``hf:ORG/REPO/FILE.gguf`` through ``huggingface_hub``, against a fake Hub speaking the Hub's
protocol on a real socket (this machine cannot reach huggingface.co): the resolve endpoint's
metadata headers and its redirect to a CDN, ranged reads for a resumed download, the Hub's error
codes. The download lands in a Hugging Face cache in a temp dir, the store links it; offline
mode is run for real, in a ``kimi-server models pull`` process with ``HF_HUB_OFFLINE=1``."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest
from huggingface_hub import constants
from huggingface_hub.utils import _http as hf_http
from typer.testing import CliRunner

from kimi_server.models.cli import models_app
from kimi_server.models.hf import hf_download, parse_hf_ref
from kimi_server.models.pull import ModelPullError, resolve_model
from kimi_server.models.store import ModelStore

PAYLOAD = b"GGUF" + bytes(range(256)) * 40
SHA = hashlib.sha256(PAYLOAD).hexdigest()
COMMIT = "c0ffee" * 6 + "0123"
FILES = {("org/repo", "sub/model.gguf"): PAYLOAD}
RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")


class FakeHub(BaseHTTPRequestHandler):
    """The Hub's resolve endpoint on ``localhost``, its CDN on ``127.0.0.1`` (another host)."""

    protocol_version = "HTTP/1.1"
    seen: ClassVar[list[tuple[str, str, dict[str, str]]]] = []
    drop_after: ClassVar[int | None] = None  # the next whole-blob answer breaks off after this many bytes

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def do_GET(self) -> None:
        self._answer(body=True)

    def _answer(self, body: bool) -> None:
        FakeHub.seen.append((self.command, self.path, {k.lower(): v for k, v in self.headers.items()}))
        if self.path == f"/cdn/{SHA}":
            return self._blob(body)
        m = RESOLVE.match(self.path)
        if m is None or m["repo"] not in {r for r, _ in FILES} | {"org/gated"}:
            return self._error(401, "RepoNotFound")
        if m["repo"] == "org/gated":
            return self._error(403, "GatedRepo")
        if m["rev"] not in ("main", COMMIT):
            return self._error(404, "RevisionNotFound")
        if (m["repo"], m["file"]) not in FILES:
            return self._error(404, "EntryNotFound")
        self.send_response(302)
        port = self.server.server_address[1]  # type: ignore[index]  # an (address, port) pair here
        self.send_header("Location", f"http://127.0.0.1:{port}/cdn/{SHA}")
        self.send_header("X-Repo-Commit", COMMIT)
        self.send_header("X-Linked-Etag", f'"{SHA}"')
        self.send_header("X-Linked-Size", str(len(PAYLOAD)))
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _blob(self, body: bool) -> None:
        start = 0
        ranged = re.match(r"bytes=(\d+)-$", self.headers.get("Range", ""))
        if ranged:
            start = int(ranged[1])
        self.send_response(206 if ranged else 200)
        if ranged:
            self.send_header("Content-Range", f"bytes {start}-{len(PAYLOAD) - 1}/{len(PAYLOAD)}")
        self.send_header("Content-Length", str(len(PAYLOAD) - start))
        self.send_header("ETag", f'"{SHA}"')
        self.end_headers()
        if body and FakeHub.drop_after is not None and not ranged:
            self.wfile.write(PAYLOAD[: FakeHub.drop_after])
            FakeHub.drop_after = None
            self.close_connection = True  # the connection breaks mid-body
        elif body:
            self.wfile.write(PAYLOAD[start:])

    def _error(self, status: int, code: str) -> None:
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        return None


@pytest.fixture(scope="module")
def hub() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeHub)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://localhost:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def store(tmp_path: Path) -> ModelStore:
    return ModelStore(tmp_path / "models")


@pytest.fixture
def hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A Hugging Face cache of this test's own (the library's default one is left alone)."""
    cache = tmp_path / "hf-cache"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    return cache


def test_download_through_the_shared_cache_with_the_token(
    hub: str, store: ModelStore, hf_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    FakeHub.seen.clear()
    path = hf_download("org/repo", "sub/model.gguf", store, sha256=SHA, endpoint=hub)
    assert path == store.root / "hf" / "org" / "repo" / "sub" / "model.gguf"
    assert path.read_bytes() == PAYLOAD
    # The bytes live once, in the Hugging Face cache; the store links to them.
    blob = hf_cache / "models--org--repo" / "blobs" / SHA
    assert blob.read_bytes() == PAYLOAD and path.resolve() == blob.resolve()
    hub_calls = [h for m, p, h in FakeHub.seen if "/resolve/" in p]
    cdn_calls = [h for m, p, h in FakeHub.seen if p.startswith("/cdn/")]
    assert hub_calls and all(h.get("authorization") == "Bearer hf_secret" for h in hub_calls)
    assert cdn_calls and not any("authorization" in h for h in cdn_calls)  # never sent to the CDN
    name = "hf:org/repo/sub/model.gguf"
    assert parse_hf_ref(name) == ("org/repo", "sub/model.gguf")
    assert store.path_for(name) == path and resolve_model(name, store, auto_pull=False) == path
    assert [(m.name, m.verified) for m in store.list()] == [(name, True)]


def test_a_broken_download_resumes(
    hub: str, store: ModelStore, hf_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 1024)  # what a 10 MB chunk is to a real model
    FakeHub.seen.clear()
    FakeHub.drop_after = 3000
    path = hf_download("org/repo", "sub/model.gguf", store, endpoint=hub)
    assert path.read_bytes() == PAYLOAD
    ranges = [h.get("range") for m, p, h in FakeHub.seen if m == "GET" and p.startswith("/cdn/")]
    assert ranges[0] is None and len(ranges) == 2
    assert re.fullmatch(r"bytes=(\d+)-", ranges[1] or "") and ranges[1] != "bytes=0-"  # the rest, not it all again


def test_a_sha_mismatch_is_not_kept(hub: str, store: ModelStore, hf_cache: Path) -> None:
    with pytest.raises(ModelPullError, match="does not match"):
        hf_download("org/repo", "sub/model.gguf", store, sha256="0" * 64, endpoint=hub)
    assert store.path_for("hf:org/repo/sub/model.gguf") is None
    assert not [p for p in store.root.rglob("*") if p.is_file() or p.is_symlink()]


@pytest.mark.parametrize(
    ("repo", "filename", "revision", "message"),
    [
        ("org/missing", "model.gguf", "main", "no such repository, or it is private"),
        ("org/gated", "model.gguf", "main", "gated: accept the model's terms"),
        ("org/repo", "other.gguf", "main", "has no such file"),
        ("org/repo", "sub/model.gguf", "v9", "has no revision 'v9'"),
    ],
)
def test_hub_errors_are_one_clear_line(
    hub: str, store: ModelStore, hf_cache: Path, repo: str, filename: str, revision: str, message: str
) -> None:
    with pytest.raises(ModelPullError) as caught:
        hf_download(repo, filename, store, revision=revision, endpoint=hub)
    text = str(caught.value)
    assert text.startswith(f"hf:{repo}/{filename}: ") and message in text and "\n" not in text


class _NoBackoff:
    """The Hub client's ``time`` without its waits between retries (they are not the point here)."""

    def __getattr__(self, name: str) -> object:
        return getattr(time, name)

    @staticmethod
    def sleep(seconds: float) -> None:
        return None


def test_an_unreachable_hub_says_so(store: ModelStore, hf_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hf_http, "time", _NoBackoff())
    with pytest.raises(ModelPullError) as caught:
        hf_download("org/repo", "sub/model.gguf", store, endpoint="http://127.0.0.1:9")
    assert "http://127.0.0.1:9 could not be reached" in str(caught.value)
    assert str(hf_cache) in str(caught.value)


def test_cli_pull_offline_uses_the_cache_and_explains_a_miss(
    hub: str, store: ModelStore, hf_cache: Path, tmp_path: Path
) -> None:
    name = "hf:org/repo/sub/model.gguf"
    result = CliRunner().invoke(models_app, ["pull", name, "--models-dir", str(store.root)], env={"HF_ENDPOINT": hub})
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == str(store.file_for(name))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hf_cache), "HF_ENDPOINT": "http://127.0.0.1:9"}
    other = tmp_path / "other-models"  # a store without it: the file comes from the cache alone
    run = [sys.executable, "-m", "kimi_server.models.cli", "pull", name, "--models-dir", str(other)]
    done = subprocess.run(run, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).read_bytes() == PAYLOAD
    missing = subprocess.run(
        [*run[:4], "hf:org/repo/absent.gguf", *run[5:]], env=env, capture_output=True, text=True, timeout=120
    )
    assert missing.returncode == 1 and "Traceback" not in missing.stderr
    assert "offline mode is on (HF_HUB_OFFLINE)" in missing.stderr and "not in the Hugging Face cache" in missing.stderr
