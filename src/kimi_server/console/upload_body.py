"""A ``multipart/form-data`` body for ``POST /v1/files`` (text fields and one file), written as
a client writes it and read from the file piece by piece, so an upload the console passes on
is never held in memory whole."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator

from starlette.datastructures import UploadFile

from kimi_server.console.dispatch import Streamed

_PIECE = 1024 * 1024


def file_form(fields: dict[str, str], name: str, upload: UploadFile) -> Streamed:
    """``fields`` as text parts, then ``upload`` as the part ``name`` under its own file name."""
    boundary = "kimi-console-" + secrets.token_hex(16)
    head = b"".join(
        f'--{boundary}\r\nContent-Disposition: form-data; name="{field}"\r\n\r\n{value}\r\n'.encode()
        for field, value in fields.items()
    )
    head += (
        f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="{_quoted(upload.filename or "")}"'
        "\r\nContent-Type: application/octet-stream\r\n\r\n"
    ).encode()
    tail = f"\r\n--{boundary}--\r\n".encode()
    size = upload.size if upload.size is not None else _size(upload)
    return Streamed(
        f"multipart/form-data; boundary={boundary}", len(head) + size + len(tail), _pieces(head, upload, tail)
    )


def _quoted(filename: str) -> str:
    """The name as it goes between quotes: backslash and quote escaped (the parser undoes both),
    line breaks written as browsers write them (``%0D``, ``%0A``), so the name can never end the
    header. The Files API then checks the name as it checks any client's."""
    escaped = filename.replace("\\", "\\\\").replace('"', '\\"')
    return escaped.replace("\r", "%0D").replace("\n", "%0A")


def _size(upload: UploadFile) -> int:
    upload.file.seek(0, 2)
    return upload.file.tell()


async def _pieces(head: bytes, upload: UploadFile, tail: bytes) -> AsyncIterator[bytes]:
    yield head
    await upload.seek(0)
    while piece := await upload.read(_PIECE):
        yield piece
    yield tail
