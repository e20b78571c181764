"""Downloading a GGUF file from a Hugging Face repository (for machines with internet access).

Referred to as ``hf:ORG/REPO/FILE.gguf``; stored under ``<models dir>/hf/ORG/REPO/FILE.gguf``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath
from urllib.parse import quote

import httpx
from rich.console import Console

from .store import CHUNK_BYTES, HF_PREFIX, ModelPullError, ModelStore, transfer_progress

DEFAULT_ENDPOINT = "https://huggingface.co"
# Generous read timeout: the CDN can pause between chunks of a multi-GB file.
_TIMEOUT = httpx.Timeout(30.0, read=120.0)
_REPO_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_STATUS_HINTS = {
    401: "the repository is private or gated: pass a token or set HF_TOKEN",
    403: "access denied: accept the model's terms on its page, or check the token's scope",
    404: "no such repository, revision or file",
}


def hf_name(repo_id: str, filename: str) -> str:
    return f"{HF_PREFIX}{repo_id}/{filename}"


def parse_hf_ref(ref: str) -> tuple[str, str]:
    """``hf:ORG/REPO/path/FILE.gguf`` → (``ORG/REPO``, ``path/FILE.gguf``)."""
    parts = ref.removeprefix(HF_PREFIX).split("/")
    if len(parts) < 3:
        raise ModelPullError(f"expected hf:ORG/REPO/FILE.gguf, got {ref!r}")
    repo_id, filename = "/".join(parts[:2]), "/".join(parts[2:])
    _validate(repo_id, filename)
    return repo_id, filename


def hf_download(
    repo_id: str,
    filename: str,
    store: ModelStore,
    *,
    revision: str = "main",
    token: str | None = None,
    sha256: str | None = None,
    console: Console | None = None,
    transport: httpx.BaseTransport | None = None,
    endpoint: str | None = None,
) -> Path:
    """Stream ``filename`` from ``repo_id`` at ``revision`` into the store and return its path.

    The token comes from ``token`` or ``$HF_TOKEN``; the endpoint from ``endpoint``,
    ``$HF_ENDPOINT`` or huggingface.co. With ``sha256`` the file is kept only if it matches.
    """
    _validate(repo_id, filename)
    url = _resolve_url(endpoint, repo_id, revision, filename)
    name = hf_name(repo_id, filename)
    console = console or Console(stderr=True)
    # Identity encoding keeps Content-Length equal to the file's size.
    headers = {"Accept-Encoding": "identity", **_auth_header(token)}
    # httpx drops Authorization when a redirect leaves the hub's origin (the CDN URL is signed).
    with httpx.Client(transport=transport, follow_redirects=True, timeout=_TIMEOUT) as client:
        try:
            with client.stream("GET", url, headers=headers) as response:
                _raise_for_status(response, url)
                _save(response, store, name, sha256=sha256, origin=url, console=console)
        except httpx.HTTPError as exc:
            raise ModelPullError(f"downloading {url} failed: {exc}") from exc
    return store.file_for(name)


def _save(
    response: httpx.Response,
    store: ModelStore,
    name: str,
    *,
    sha256: str | None,
    origin: str,
    console: Console,
) -> None:
    total = _content_length(response)
    with (
        transfer_progress(console, name, total) as advance,
        store.writer(name, size=total, sha256=sha256, origin=origin) as out,
    ):
        for chunk in response.iter_bytes(CHUNK_BYTES):
            out.write(chunk)
            advance(len(chunk))


def _validate(repo_id: str, filename: str) -> None:
    owner, _, repo = repo_id.partition("/")
    if not (_REPO_PART.match(owner) and _REPO_PART.match(repo)):
        raise ModelPullError(f"not a Hugging Face repository id (ORG/REPO): {repo_id!r}")
    path = PurePosixPath(filename)
    if path.is_absolute() or ".." in path.parts or path.suffix.lower() != ".gguf":
        raise ModelPullError(f"expected a .gguf file inside the repository, got {filename!r}")


def _resolve_url(endpoint: str | None, repo_id: str, revision: str, filename: str) -> str:
    base = (endpoint or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
    # Revisions such as refs/pr/1 must be one path segment.
    return f"{base}/{repo_id}/resolve/{quote(revision, safe='')}/{quote(filename)}"


def _auth_header(token: str | None) -> dict[str, str]:
    token = token or os.environ.get("HF_TOKEN")
    return {"Authorization": f"Bearer {token}"} if token else {}


def _raise_for_status(response: httpx.Response, url: str) -> None:
    if response.is_success:
        return
    hint = _STATUS_HINTS.get(response.status_code, response.reason_phrase)
    raise ModelPullError(f"{url}: HTTP {response.status_code}: {hint}")


def _content_length(response: httpx.Response) -> int | None:
    value = response.headers.get("Content-Length", "")
    return int(value) if value.isdigit() else None
