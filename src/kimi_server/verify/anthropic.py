"""The Messages door as an Anthropic client reaches it: its URLs, the headers the ``anthropic``
SDKs send (``x-api-key``, ``anthropic-version``), Anthropic's error shape and its event stream.
Raw HTTP through the run's client, so every request keeps the run's deadlines; no Anthropic SDK
is needed at run time.

The Messages base is the one given with ``--anthropic-url`` (``ANTHROPIC_BASE_URL``: the SDK
appends ``/v1/messages``), else the OpenAI base's own host: ``…/v1`` serves ``…/v1/messages``.
The model list is ``/v1/models`` under that base; without one, ``/anthropic/v1/models`` on the
host, where Kimi's platform (and kimi-server) serve it, since ``/v1/models`` there is OpenAI's.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from kimi_server.verify.outcome import Failed, expect
from kimi_server.verify.target import ANSWER_TOKENS, Target, error_text

VERSION = "2023-06-01"  # the version every Anthropic SDK sends
SAY_OK = [{"role": "user", "content": "Reply with OK."}]
Event = tuple[str | None, dict[str, Any]]  # the SSE event name and its decoded data


def base(t: Target) -> str:
    return t.anthropic_url.rstrip("/") if t.anthropic_url else t.base_url.removesuffix("/v1")


def messages_url(t: Target, path: str = "") -> str:
    return f"{base(t)}/v1/messages{path}"


def models_url(t: Target) -> str:
    return f"{base(t)}/v1/models" if t.anthropic_url else f"{base(t)}/anthropic/v1/models"


def headers(key: str | None, *, bearer: bool = False) -> dict[str, str]:
    """What an Anthropic SDK sends; ``key`` None sends none."""
    sent = {"anthropic-version": VERSION}
    if key is not None:
        sent.update({"Authorization": f"Bearer {key}"} if bearer else {"x-api-key": key})
    return sent


def body(t: Target, model: str, *, max_tokens: int = ANSWER_TOKENS, **extra: Any) -> dict[str, Any]:
    """A short request at the model's lowest effort (``output_config.effort``)."""
    low = t.low_effort(model)
    effort = {"output_config": {"effort": low["reasoning_effort"]}} if low else {}
    return {"model": model, "max_tokens": max_tokens, "messages": SAY_OK, **effort, **extra}


def post(
    t: Target,
    payload: Any,
    *,
    path: str = "",
    key: str | None = "",
    bearer: bool = False,
    raw: bytes | None = None,
) -> httpx.Response:
    """POST to the Messages door; ``key`` "" is the run's key, None no key at all."""
    sent = headers(t.key if key == "" else key, bearer=bearer)
    url = messages_url(t, path)
    if raw is not None:
        return t.http.post(url, content=raw, headers={**sent, "Content-Type": "application/json"})
    return t.http.post(url, json=payload, headers=sent)


def answered(resp: httpx.Response, where: str = "") -> dict[str, Any]:
    """The JSON body of a 200, or a failure quoting the error."""
    prefix = f"{where}: " if where else ""
    expect(resp.status_code == 200, f"{prefix}HTTP {resp.status_code}: {error_text(resp)}")
    data = resp.json()
    expect(isinstance(data, dict), f"{prefix}the body is not a JSON object")
    assert isinstance(data, dict)
    return data


def error_of(resp: httpx.Response, status: int, kind: str, where: str) -> str:
    """The error message, failing unless the answer is ``status`` with
    ``{"type": "error", "error": {"type": kind, "message"}}``."""
    got = "200 (accepted)" if resp.status_code == 200 else f"{resp.status_code}: {error_text(resp)[:100]}"
    expect(resp.status_code == status, f"{where}: expected {status}, got {got}")
    try:
        payload = resp.json()
    except ValueError:
        raise Failed(f"{where}: a body that is not JSON: {resp.text[:60]!r}") from None
    error = payload.get("error") if isinstance(payload, dict) else None
    shape_ok = isinstance(payload, dict) and payload.get("type") == "error" and isinstance(error, dict)
    expect(shape_ok, f'{where}: not {{"type": "error", "error": {{…}}}}: {str(payload)[:100]}')
    assert isinstance(error, dict)
    expect(error.get("type") == kind, f"{where}: error.type {error.get('type')!r}, not {kind!r}")
    message = error.get("message")
    expect(isinstance(message, str) and bool(message), f"{where}: the error message is empty")
    return str(message)


def refused(t: Target, payload: Any, *, names: str, where: str, path: str = "") -> None:
    """A bad request: 400 ``invalid_request_error`` whose message names ``names``."""
    message = error_of(post(t, payload, path=path), 400, "invalid_request_error", where)
    expect(names in message, f"{where}: the error does not name {names!r}: {message[:100]!r}")


def events(t: Target, payload: dict[str, Any]) -> list[Event]:
    """Each event of a streamed answer, decoded; a data line that is not JSON fails."""
    out: list[Event] = []
    for name, data in t.sse(messages_url(t), payload, headers(t.key)):
        try:
            out.append((name, json.loads(data)))
        except ValueError:
            raise Failed(f"an SSE event is not JSON: {data[:60]!r}") from None
    return out
