"""Images for the embedded engine when a multimodal projector is loaded (``mmproj``).

llama.cpp's completion call takes ``{"prompt_string": ..., "multimodal_data": [base64, ...]}``,
with one media marker in the prompt text per image, in order. Each marker is preceded by a
digest of its image, so two prompts with the same words but different images never look like
the same prefix to the prompt-cache ledger (which compares text).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from kimi_server.engines.types import GenerationRequest
from kimi_server.errors import InvalidRequestError

MEDIA_MARKER = "<__media__>"  # llama.cpp's mtmd default marker


def payload(data_url: str) -> str:
    """The base64 part of a checked ``data:`` URL (the serving layer only hands on those)."""
    head, _, data = data_url.partition(",")
    if not head.startswith("data:") or not head.endswith(";base64"):
        raise InvalidRequestError("Images must reach the engine as base64 data URLs.", param="messages")
    return data


def media_of(request: GenerationRequest) -> tuple[str, ...]:
    """Every image's base64 data, in prompt order; videos are refused (no frames support here)."""
    out: list[str] = []
    for i, m in enumerate(request.messages):
        if m.videos:
            raise InvalidRequestError(
                f"This model cannot watch videos: 'messages[{i}]' carries one. Send images instead.",
                param=f"messages[{i}]",
                code="unsupported_content",
            )
        out.extend(payload(u) for u in m.images)
    return tuple(out)


def marked_text(text: str, images: Sequence[str]) -> str:
    marks = "".join(f"[image {hashlib.sha256(u.encode()).hexdigest()[:16]}]{MEDIA_MARKER}\n" for u in images)
    return marks + text


def prompt_field(prompt: str, media: Sequence[str]) -> Any:
    return {"prompt_string": prompt, "multimodal_data": list(media)} if media else prompt
