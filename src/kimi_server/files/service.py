"""The files of each key: upload (checked, extracted or checked as media, then published within
the quotas), list, look up, delete, and read back: as text, as bytes, or as the media an
``ms://<file_id>`` part names. Another key's file is never found: every look-up is by the
calling key's id."""

from __future__ import annotations

import asyncio
import os
import time
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Literal

from kimi_server.errors import InvalidRequestError, NotFoundError, PayloadTooLargeError
from kimi_server.files.extract import Extractor
from kimi_server.files.limits import FileLimits, check_room, check_size
from kimi_server.files.store import DATA, TEXT, FileStore, StoredFile, new_file_id, write_private
from kimi_server.media.checks import Kind, MediaLimits, check_bytes, refuse
from kimi_server.settings import Settings

PURPOSES = ("file-extract", "image", "video")
Purpose = Literal["file-extract", "image", "video"]
_MAX_NAME = 255


@dataclass(frozen=True)
class Page:
    files: list[StoredFile]
    has_more: bool


class FileService:
    def __init__(self, root: Path, limits: FileLimits, media: MediaLimits, extractor: Extractor | None = None) -> None:
        self.store = FileStore(root)
        self.limits = limits
        self.media = media
        self.extractor = extractor or Extractor(limits)

    @classmethod
    def from_settings(cls, settings: Settings, media: MediaLimits) -> FileService:
        root = settings.files_dir or settings.data_dir / "files"
        return cls(root, FileLimits.from_settings(settings), media)

    # -- upload -----------------------------------------------------------------------------

    async def upload(self, key_id: str, source: BinaryIO, filename: str | None, purpose: str) -> StoredFile:
        chosen = check_purpose(purpose)
        name = check_name(filename)
        staged = await asyncio.to_thread(self.store.stage)
        try:
            size = await asyncio.to_thread(_copy, source, staged / DATA, self.limits.max_bytes)
            check_size(size, self.limits)
            check_room(await asyncio.to_thread(self.store.usage, key_id), size, self.limits)  # before the work
            meta = await self._process(staged, name, chosen, size)
            await asyncio.to_thread(self.store.publish, staged, key_id, meta, self.limits)
        except BaseException:
            self.store.discard(staged)  # also when the client left (a cancellation)
            raise
        return meta

    async def _process(self, staged: Path, name: str, purpose: Purpose, size: int) -> StoredFile:
        now = int(time.time())
        if purpose == "file-extract":
            got = await self.extractor.extract(staged / DATA, name)
            await asyncio.to_thread(write_private, staged / TEXT, got.text.encode("utf-8"))
            details = ""
            if got.truncated:
                details = f"Only the first {self.limits.max_chars} characters of text were kept (files_max_chars)."
            return StoredFile(new_file_id(), name, purpose, size, now, got.file_type, got.title, details)
        kind: Kind = "image" if purpose == "image" else "video"
        data = await asyncio.to_thread(self._media_bytes, staged / DATA, kind, "file")
        checked = await asyncio.to_thread(check_bytes, data, None, kind, "file", self.media)
        return StoredFile(new_file_id(), name, purpose, size, now, checked.mime)

    def _media_bytes(self, path: Path, kind: Kind, where: str) -> bytes:
        cap = self.media.max_image_bytes if kind == "image" else self.media.max_video_bytes
        if path.stat().st_size > cap:
            raise refuse(where, f"the file is larger than {cap} bytes.", "media_too_large")
        return path.read_bytes()

    # -- reading ----------------------------------------------------------------------------

    async def page(self, key_id: str, purpose: str | None, after: str | None, limit: int | None) -> Page:
        files = await asyncio.to_thread(self.store.list, key_id)
        if purpose is not None:
            files = [f for f in files if f.purpose == purpose]
        if after is not None:
            ids = [f.id for f in files]
            files = files[ids.index(after) + 1 :] if after in ids else []
        if limit is not None and len(files) > limit:
            return Page(files[:limit], has_more=True)
        return Page(files, has_more=False)

    async def get(self, key_id: str, file_id: str) -> StoredFile:
        found = await asyncio.to_thread(self.store.get, key_id, file_id)
        if found is None:
            raise not_found(file_id)
        return found

    async def delete(self, key_id: str, file_id: str) -> None:
        if not await asyncio.to_thread(self.store.delete, key_id, file_id):
            raise not_found(file_id)

    async def text(self, key_id: str, stored: StoredFile) -> str:
        path = self.store.text_path(key_id, stored.id)
        assert path is not None
        return (await asyncio.to_thread(path.read_bytes)).decode("utf-8")

    async def data(self, key_id: str, stored: StoredFile) -> bytes:
        return await asyncio.to_thread(self._data_path(key_id, stored).read_bytes)

    def _data_path(self, key_id: str, stored: StoredFile) -> Path:
        path = self.store.data_path(key_id, stored.id)
        assert path is not None  # a stored file's id matches the pattern
        return path

    async def media_part(self, key_id: str, file_id: str, kind: Kind, where: str) -> bytes:
        """The bytes an ``ms://<file_id>`` image or video part names: a file of this key,
        uploaded for that kind of part. The caller checks them as it checks any media."""
        stored = await asyncio.to_thread(self.store.get, key_id, file_id)
        if stored is None:
            raise InvalidRequestError(
                f"'{where}': no file '{_shown(file_id)}' was uploaded with this key.",
                param=where,
                code="file_not_found",
            )
        if stored.purpose != kind:
            raise InvalidRequestError(
                f"'{where}': file '{stored.id}' was uploaded with purpose '{stored.purpose}'; "
                f"an {kind} part takes a file uploaded with purpose '{kind}'.",
                param=where,
                code="invalid_file_purpose",
            )
        return await asyncio.to_thread(self._media_bytes, self._data_path(key_id, stored), kind, where)


def check_purpose(purpose: str) -> Purpose:
    for known in ("file-extract", "image", "video"):
        if purpose == known:
            return known
    raise InvalidRequestError(
        f"Invalid value for 'purpose': '{_shown(purpose)}'; it must be one of {', '.join(PURPOSES)}.",
        param="purpose",
        code="invalid_value",
    )


def check_name(filename: str | None) -> str:
    """The client's name for the file, kept as a label. A name that is a path (or holds
    control characters) is refused: clients send a bare name, and this server never makes a
    path of it either way."""
    name = filename or ""
    if not name.strip():
        raise InvalidRequestError("The file part has no file name.", param="file", code="invalid_file_name")
    if len(name) > _MAX_NAME:
        raise InvalidRequestError(
            f"The file name is {len(name)} characters; at most {_MAX_NAME}.", param="file", code="invalid_file_name"
        )
    if "/" in name or "\\" in name or name in (".", "..") or any(unicodedata.category(c) == "Cc" for c in name):
        raise InvalidRequestError(
            "The file name must be a bare name such as 'report.pdf', not a path, and hold no control characters.",
            param="file",
            code="invalid_file_name",
        )
    return name


def not_found(file_id: str) -> NotFoundError:
    return NotFoundError(f"No file '{_shown(file_id)}' was found.", param="file_id", code="file_not_found")


def _shown(value: str) -> str:
    """A client's value quoted back: short, and printable."""
    short = "".join(c if c.isprintable() else "?" for c in value[:64])
    return short + ("…" if len(value) > 64 else "")


def _copy(source: BinaryIO, target: Path, max_bytes: int) -> int:
    """Copies the upload into the store, refusing it past ``max_bytes`` (a chunked body has no
    declared length to refuse it by)."""
    source.seek(0)
    size = 0
    with os.fdopen(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as out:
        while chunk := source.read(1024 * 1024):
            size += len(chunk)
            if size > max_bytes:
                raise PayloadTooLargeError(
                    f"The file is larger than this server takes ({max_bytes} bytes, files_max_bytes).",
                    param="file",
                    code="file_too_large",
                )
            out.write(chunk)
    return size
