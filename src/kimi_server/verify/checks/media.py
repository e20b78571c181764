"""Image and video parts: answered, or refused in the error shape naming the part; never a
server error. Corrupt media is always a 400 naming the part."""

from __future__ import annotations

import base64
import struct
import zlib
from typing import Any

from kimi_server.verify.outcome import expect
from kimi_server.verify.registry import check
from kimi_server.verify.target import Target, error_shape

CHAT = "/chat/completions"


def png(width: int = 8, height: int = 8) -> bytes:
    """A small valid red PNG, made here so the tool carries no binary files."""

    def part(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + b"\xff\x00\x00" * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + part(b"IHDR", header) + part(b"IDAT", zlib.compress(rows)) + part(b"IEND", b"")


def _ask(part: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [part, {"type": "text", "text": "What colour is this?"}]}]


@check("media", "image answered or refused")
def image(t: Target, model: str) -> str:
    url = "data:image/png;base64," + base64.b64encode(png()).decode()
    body = {
        "model": model,
        "messages": _ask({"type": "image_url", "image_url": {"url": url}}),
        "max_completion_tokens": 64,
        **t.low_effort(model),
    }
    resp = t.post(CHAT, body)
    if resp.status_code == 200:
        expect(bool(resp.json().get("choices")), "an answer with no choices")
        return "answered"
    expect(resp.status_code == 400, f"HTTP {resp.status_code} (an answer or a 400 expected)")
    error = error_shape(resp)
    expect("messages[0].content[0]" in str(error.get("param")) + error["message"], "the refusal does not name the part")
    return f"refused: {error['message']}"


@check("media", "corrupt image refused")
def corrupt_image(t: Target, model: str) -> None:
    part = {"type": "image_url", "image_url": {"url": "data:image/png;base64,aGVsbG8gd29ybGQ="}}
    t.refused(
        CHAT, {"model": model, "messages": _ask(part), "max_completion_tokens": 1}, param="messages[0].content[0]"
    )


@check("media", "corrupt video refused")
def corrupt_video(t: Target, model: str) -> None:
    part = {"type": "video_url", "video_url": {"url": "data:video/mp4;base64,aGVsbG8gd29ybGQ="}}
    t.refused(
        CHAT, {"model": model, "messages": _ask(part), "max_completion_tokens": 1}, param="messages[0].content[0]"
    )
