"""The credentials a request presents, as one ``Authorization`` value: the header itself, or an
Anthropic client's ``x-api-key`` (what the ``anthropic`` SDKs and Claude Code send) as a bearer
token. ``Authorization`` wins when a request sends both."""

from __future__ import annotations

from collections.abc import Mapping


def presented(headers: Mapping[bytes, bytes]) -> str | None:
    raw = headers.get(b"authorization")
    if raw is not None:
        return raw.decode("latin-1")
    api_key = headers.get(b"x-api-key")
    if api_key is not None:
        return "Bearer " + api_key.decode("latin-1").strip()
    return None
