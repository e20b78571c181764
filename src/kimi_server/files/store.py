"""Files on disk, one folder per key and one per file, its metadata in a ``meta.json`` beside
the bytes (docs/files.md says why not the database).

    <files_dir>/<key>/<file_id>/{meta.json, data, text.txt}
    <files_dir>/.staging/…        an upload being made, or a file being deleted

A file appears by one rename of its finished folder and disappears by another, so nobody ever
reads half a file. Client file names are labels in ``meta.json``, never part of a path: every
path is built from the key id and a file id the server made (and checked against its pattern).
Quotas are checked and the file published under one lock on ``.lock``, which every worker
process of the server shares. All methods block: callers run them in a worker thread.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kimi_server.files.limits import FileLimits, Usage, check_room

log = logging.getLogger(__name__)

_ALPHABET = "0123456789abcdefghijklmnopqrstuv"
FILE_ID = re.compile(r"^[0-9a-v]{20}$")  # 100 random bits, Moonshot's length
_SAFE_OWNER = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
META, DATA, TEXT = "meta.json", "data", "text.txt"
STAGING = ".staging"
_STALE_STAGING_S = 3600  # an upload older than this was cut off by a crash


@dataclass(frozen=True)
class StoredFile:
    id: str
    filename: str  # the client's name for it: a label, never a path
    purpose: str
    bytes: int
    created_at: int
    file_type: str  # the media type its bytes showed
    title: str = ""
    status_details: str = ""


def new_file_id() -> str:
    return "".join(secrets.choice(_ALPHABET) for _ in range(20))


class FileStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        self._swept = False

    # -- paths ------------------------------------------------------------------------------

    def _owner(self, key_id: str) -> Path:
        name = key_id if _SAFE_OWNER.match(key_id) else "h" + hashlib.sha256(key_id.encode()).hexdigest()[:32]
        return self.root / name

    def _folder(self, key_id: str, file_id: str) -> Path | None:
        return self._owner(key_id) / file_id if FILE_ID.match(file_id) else None

    def data_path(self, key_id: str, file_id: str) -> Path | None:
        folder = self._folder(key_id, file_id)
        return folder / DATA if folder is not None else None

    def text_path(self, key_id: str, file_id: str) -> Path | None:
        folder = self._folder(key_id, file_id)
        return folder / TEXT if folder is not None else None

    # -- reading ----------------------------------------------------------------------------

    def get(self, key_id: str, file_id: str) -> StoredFile | None:
        folder = self._folder(key_id, file_id)
        return _read_meta(folder / META) if folder is not None else None

    def list(self, key_id: str) -> list[StoredFile]:
        owner = self._owner(key_id)
        found = [_read_meta(owner / name / META) for name in _names(owner) if FILE_ID.match(name)]
        return sorted((f for f in found if f is not None), key=lambda f: (-f.created_at, f.id))

    def usage(self, key_id: str) -> Usage:
        owner_name = self._owner(key_id).name
        key_files = key_bytes = total = 0
        for owner in _names(self.root):
            if owner.startswith("."):
                continue
            for name in _names(self.root / owner):
                size = _size(self.root / owner / name / DATA)
                total += size
                if owner == owner_name:
                    key_files += 1
                    key_bytes += size
        return Usage(key_files=key_files, key_bytes=key_bytes, total_bytes=total)

    # -- writing ----------------------------------------------------------------------------

    def stage(self) -> Path:
        """A new private folder to build an upload in, on the same file system as its home."""
        staging = self.root / STAGING
        staging.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._sweep(staging)
        folder = staging / f"{time.time_ns()}-{secrets.token_hex(8)}"
        folder.mkdir(mode=0o700)
        return folder

    def publish(self, staged: Path, key_id: str, meta: StoredFile, limits: FileLimits) -> None:
        """Writes the metadata and makes the staged folder the file, if the quotas allow it."""
        write_private(staged / META, json.dumps(asdict(meta), ensure_ascii=False).encode())
        with self._locked():
            check_room(self.usage(key_id), meta.bytes, limits)
            owner = self._owner(key_id)
            owner.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.rename(staged, owner / meta.id)

    def delete(self, key_id: str, file_id: str) -> bool:
        folder = self._folder(key_id, file_id)
        if folder is None:
            return False
        trash = self.stage()
        try:
            os.rename(folder, trash / "file")  # gone at once for every reader
        except FileNotFoundError:
            shutil.rmtree(trash, ignore_errors=True)
            return False
        shutil.rmtree(trash, ignore_errors=True)
        return True

    def discard(self, staged: Path) -> None:
        shutil.rmtree(staged, ignore_errors=True)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def _sweep(self, staging: Path) -> None:
        """Removes what a crash left in the staging folder (once per process)."""
        if self._swept:
            return
        self._swept = True
        cutoff = time.time() - _STALE_STAGING_S
        for name in _names(staging):
            path = staging / name
            try:
                if path.stat().st_mtime < cutoff:
                    shutil.rmtree(path, ignore_errors=True)
            except OSError:
                continue


def write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def _names(folder: Path) -> list[str]:
    try:
        return os.listdir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return []


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _read_meta(path: Path) -> StoredFile | None:
    try:
        raw: Any = json.loads(path.read_bytes())
        return StoredFile(**raw)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError):
        log.warning("a file's metadata could not be read; the file is skipped")
        return None
