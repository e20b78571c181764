"""What the files of one key, and of all keys together, may take; each refusal names the setting
that set the limit, so an operator knows what to raise."""

from __future__ import annotations

from dataclasses import dataclass

from kimi_server.errors import InvalidRequestError, PayloadTooLargeError
from kimi_server.settings import Settings


@dataclass(frozen=True)
class FileLimits:
    max_bytes: int  # one upload
    max_per_key: int  # files one key keeps
    max_bytes_per_key: int  # bytes one key keeps
    max_total_bytes: int  # bytes all keys keep
    max_chars: int  # extracted text kept per file
    max_pages: int  # pages of a PDF
    extract_timeout_s: float
    extract_memory_bytes: int
    extract_concurrency: int

    @classmethod
    def from_settings(cls, settings: Settings) -> FileLimits:
        return cls(
            max_bytes=settings.files_max_bytes,
            max_per_key=settings.files_max_per_key,
            max_bytes_per_key=settings.files_max_bytes_per_key,
            max_total_bytes=settings.files_max_total_bytes,
            max_chars=settings.files_max_chars,
            max_pages=settings.files_max_pages,
            extract_timeout_s=settings.files_extract_timeout_s,
            extract_memory_bytes=settings.files_extract_memory_mb * 1024 * 1024,
            extract_concurrency=settings.files_extract_concurrency,
        )

    @property
    def upload_body_bytes(self) -> int:
        """The largest request body an upload may be: the file plus room for the form around it."""
        return self.max_bytes + 1024 * 1024


@dataclass(frozen=True)
class Usage:
    """What a key keeps, and what all keys keep together."""

    key_files: int
    key_bytes: int
    total_bytes: int


def check_size(size: int, limits: FileLimits) -> None:
    if size > limits.max_bytes:
        raise PayloadTooLargeError(
            f"The file is {size} bytes; this server takes files of at most {limits.max_bytes} bytes (files_max_bytes).",
            param="file",
            code="file_too_large",
        )
    if size == 0:
        raise InvalidRequestError("The file is empty.", param="file", code="empty_file")


def check_room(usage: Usage, size: int, limits: FileLimits) -> None:
    """Whether one more file of ``size`` bytes fits what the key, and the server, may keep."""
    if usage.key_files + 1 > limits.max_per_key:
        raise InvalidRequestError(
            f"This key already keeps {usage.key_files} files, the most it may (files_max_per_key = "
            f"{limits.max_per_key}); delete some first.",
            param="file",
            code="too_many_files",
        )
    if usage.key_bytes + size > limits.max_bytes_per_key:
        raise PayloadTooLargeError(
            f"This key keeps {usage.key_bytes} bytes of files; {size} more would pass the "
            f"{limits.max_bytes_per_key} bytes it may keep (files_max_bytes_per_key); delete some first.",
            param="file",
            code="file_storage_quota",
        )
    if usage.total_bytes + size > limits.max_total_bytes:
        raise PayloadTooLargeError(
            f"The server's file storage is full: {size} more bytes would pass its cap of "
            f"{limits.max_total_bytes} bytes (files_max_total_bytes).",
            param="file",
            code="file_storage_full",
        )
