"""The media of one request, checked (and fetched where allowed) before the engine sees them.

Each image or video part of the wire request is named as the client wrote it
(``messages[i].content[j]``, ``input[i].content[j]``), checked, and handed on as a ``data:``
URL carrying exactly the bytes checked, in ``Message.images`` / ``Message.videos`` (and ``parts``).
A part may be a ``data:`` URL, an ``ms://<file_id>`` reference to a file the calling key uploaded
(``files/service.py``), or an http(s) URL where the operator allows its host; all three are
checked alike.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from kimi_server.engines.types import GenerationRequest
from kimi_server.errors import InvalidRequestError
from kimi_server.media.checks import Kind, MediaLimits, check_bytes, decode_data_url
from kimi_server.media.fetch import Fetcher
from kimi_server.settings import Settings

if TYPE_CHECKING:
    from kimi_server.files.service import FileService

Part = tuple[str, Kind, str]  # where, kind, URL
FILE_SCHEME = "ms://"  # an uploaded file, as Kimi's platform names one


@dataclass
class MediaIntake:
    limits: MediaLimits
    fetcher: Fetcher
    max_parts: int
    files: FileService | None = None  # where ms://<file_id> parts are found; None: refused

    @classmethod
    def from_settings(cls, settings: Settings, files: FileService | None = None) -> MediaIntake:
        fetcher = Fetcher(settings.media_allowed_hosts, settings.media_fetch_timeout_s)
        return cls(media_limits(settings), fetcher, settings.media_max_parts, files)

    async def check(self, parts: list[Part], key_id: str | None = None) -> dict[str, str]:
        """URL as sent -> the checked ``data:`` URL. ``key_id``: whose files ``ms://`` names."""
        if len(parts) > self.max_parts:
            where = parts[self.max_parts][0]
            raise InvalidRequestError(
                f"'{where}': a request may carry at most {self.max_parts} images and videos.",
                param=where,
                code="too_many_media",
            )
        out: dict[str, str] = {}
        for where, kind, url in parts:
            if url in out:
                continue
            cap = self.limits.max_image_bytes if kind == "image" else self.limits.max_video_bytes
            if url.startswith("data:"):
                declared, data = decode_data_url(url, where, cap)
            elif url.startswith(FILE_SCHEME):
                declared, data = None, await self._uploaded(url, kind, where, key_id)
            else:
                declared, data = None, await self.fetcher.fetch(url, where, cap)
            checked = await asyncio.to_thread(check_bytes, data, declared, kind, where, self.limits)
            out[url] = checked.data_url()
        return out

    async def _uploaded(self, url: str, kind: Kind, where: str, key_id: str | None) -> bytes:
        if self.files is None or key_id is None:
            raise InvalidRequestError(
                f"'{where}': this server keeps no uploaded files to name with ms://.", param=where, code="invalid_media"
            )
        return await self.files.media_part(key_id, url[len(FILE_SCHEME) :], kind, where)


def media_limits(settings: Settings) -> MediaLimits:
    return MediaLimits(
        max_image_bytes=settings.media_max_image_bytes,
        max_image_pixels=settings.media_max_image_pixels,
        max_video_bytes=settings.media_max_video_bytes,
        max_video_seconds=settings.media_max_video_seconds,
    )


def _url(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    url = getattr(value, "url", None)
    return url if isinstance(url, str) else None


def chat_parts(messages: list[Any]) -> list[Part]:
    out: list[Part] = []
    for i, m in enumerate(messages):
        if not isinstance(m.content, list):
            continue
        for j, part in enumerate(m.content):
            kind: Kind | None = {"image_url": "image", "video_url": "video"}.get(part.type)  # type: ignore[assignment]
            if kind is None:
                continue
            url = _url(part.image_url if kind == "image" else part.video_url)
            if url is not None:
                out.append((f"messages[{i}].content[{j}]", kind, url))
    return out


def responses_parts(raw_input: Any) -> list[Part]:
    out: list[Part] = []
    if not isinstance(raw_input, list):
        return out
    for i, item in enumerate(raw_input):
        if not isinstance(item, dict):
            continue
        for field in ("content", "output"):
            parts = item.get(field)
            if not isinstance(parts, list):
                continue
            for j, part in enumerate(parts):
                if isinstance(part, dict) and part.get("type") == "input_image":
                    url = part.get("image_url")
                    if isinstance(url, str):
                        out.append((f"input[{i}].{field}[{j}]", "image", url))
    return out


def apply(request: GenerationRequest, checked: Mapping[str, str]) -> GenerationRequest:
    if not checked:
        return request
    return replace(request, messages=tuple(m.with_media_urls(checked) for m in request.messages))
