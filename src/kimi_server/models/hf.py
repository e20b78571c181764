"""Downloading a GGUF file from a Hugging Face repository, with the Hub's own client.

Referred to as ``hf:ORG/REPO/FILE.gguf``. ``huggingface_hub`` fetches it into the shared
Hugging Face cache (``HF_HOME`` / ``HF_HUB_CACHE``: other tools find it there and it is not
downloaded twice), resumes a broken download, honours ``HF_TOKEN``, ``HF_ENDPOINT`` and offline
mode (``HF_HUB_OFFLINE=1``: only what the cache holds). The store then records the cached file
under ``<models dir>/hf/ORG/REPO/FILE.gguf`` (a link to it, or a copy where links are not
possible), so ``models list`` and ``serve`` see it like any other model.
"""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath

import httpx
from huggingface_hub import constants, errors, hf_hub_download
from rich.console import Console

from .store import HF_PREFIX, ModelPullError, ModelStore

_REPO_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


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
    endpoint: str | None = None,
    cache_dir: Path | None = None,
    force: bool = False,
) -> Path:
    """Fetch ``filename`` of ``repo_id`` at ``revision`` into the Hugging Face cache, record it in
    the store and return its path there. With ``sha256`` the file is kept only if it matches.

    The token comes from ``token``, else ``$HF_TOKEN`` (or ``hf auth login``); the endpoint from
    ``endpoint``, else ``$HF_ENDPOINT``, else huggingface.co; the cache from ``cache_dir``, else
    the Hugging Face default.
    """
    _validate(repo_id, filename)
    name = hf_name(repo_id, filename)
    endpoint = endpoint or os.environ.get("HF_ENDPOINT") or None
    (console or Console(stderr=True)).print(f"Fetching {name} through the Hugging Face cache...", highlight=False)
    try:
        cached = hf_hub_download(
            repo_id,
            filename,
            revision=revision,
            token=token,
            endpoint=endpoint,
            cache_dir=cache_dir,
            force_download=force,
        )
    except (OSError, ValueError, httpx.HTTPError, errors.EntryNotFoundError) as exc:  # the Hub client's errors
        raise ModelPullError(_explain(exc, name, revision, endpoint, cache_dir)) from exc
    origin = f"{endpoint or constants.ENDPOINT}/{repo_id}@{revision}"
    return store.link(name, Path(cached), sha256=sha256, origin=origin)


def _explain(exc: Exception, name: str, revision: str, endpoint: str | None, cache_dir: Path | None) -> str:
    """What went wrong, in the user's terms: never a traceback, never the token."""
    hub = endpoint or constants.ENDPOINT
    cache = cache_dir or constants.HF_HUB_CACHE
    offline = constants.HF_HUB_OFFLINE
    known: list[tuple[type[Exception], str]] = [
        (errors.GatedRepoError, "the repository is gated: accept the model's terms on its page, then set HF_TOKEN"),
        (errors.RepositoryNotFoundError, "no such repository, or it is private: check ORG/REPO, or set HF_TOKEN"),
        (errors.RevisionNotFoundError, f"the repository has no revision {revision!r}"),
        (errors.RemoteEntryNotFoundError, "the repository has no such file at that revision"),
    ]
    for kind, why in known:
        if isinstance(exc, kind):
            return f"{name}: {why}"
    if isinstance(exc, errors.LocalEntryNotFoundError | errors.OfflineModeIsEnabled) or (
        offline and isinstance(exc, ValueError)
    ):
        where = "offline mode is on (HF_HUB_OFFLINE)" if offline else f"{hub} could not be reached"
        return f"{name}: {where} and the file is not in the Hugging Face cache ({cache})"
    if isinstance(exc, errors.HfHubHTTPError) and exc.response is not None:
        status = exc.response.status_code
        hint = " (access denied: check the token's scope)" if status == 403 else ""
        return f"{name}: {hub} answered HTTP {status}{hint}"
    return f"{name}: the download failed: {type(exc).__name__}: {exc}"


def _validate(repo_id: str, filename: str) -> None:
    owner, _, repo = repo_id.partition("/")
    if not (_REPO_PART.match(owner) and _REPO_PART.match(repo)):
        raise ModelPullError(f"not a Hugging Face repository id (ORG/REPO): {repo_id!r}")
    path = PurePosixPath(filename)
    if path.is_absolute() or ".." in path.parts or path.suffix.lower() != ".gguf":
        raise ModelPullError(f"expected a .gguf file inside the repository, got {filename!r}")
