"""Partial Mode: a last assistant message marked ``partial`` is the start of the answer, which
the model continues; the answer's content leaves the prefix out."""

from __future__ import annotations

import json
from typing import Any

from kimi_server.verify.outcome import Failed, Skipped, expect
from kimi_server.verify.registry import check
from kimi_server.verify.target import ANSWER_TOKENS, Target, error_text

CHAT = "/chat/completions"
ASK = {"role": "user", "content": "Describe a cat as a JSON object with its name and age."}
JSON_PREFIX = '{"name": "'
TEXT_PREFIX = "Cats are"


def _body(t: Target, model: str, prefix: str, **extra: Any) -> dict[str, Any]:
    messages = [ASK, {"role": "assistant", "content": prefix, "partial": True}]
    return {
        "model": model,
        "messages": messages,
        "max_completion_tokens": ANSWER_TOKENS,
        **t.low_effort(model),
        **extra,
    }


def _declined(status: int, message: str) -> None:
    """A 400 that names ``partial`` is an endpoint saying it does not continue this prefix
    (Partial Mode cleanly refused, as the contract allows), not a broken answer."""
    if status == 400 and "partial" in message:
        raise Skipped(f"the endpoint refuses this prefix: {message[:120]}")


@check("partial", "JSON prefix continued")
def json_prefix(t: Target, model: str) -> str:
    resp = t.post(CHAT, _body(t, model, JSON_PREFIX, response_format={"type": "json_object"}))
    _declined(resp.status_code, error_text(resp))
    expect(resp.status_code == 200, f"HTTP {resp.status_code}: {error_text(resp)}")
    choice = resp.json()["choices"][0]
    content = choice["message"]["content"] or ""
    expect(not content.startswith(JSON_PREFIX), f"the answer repeats the prefix: {content[:60]!r}")
    try:
        value = json.loads(JSON_PREFIX + content)
    except ValueError:
        raise Failed(f"prefix + answer is not JSON: {(JSON_PREFIX + content)[:80]!r}") from None
    expect(isinstance(value, dict) and isinstance(value.get("name"), str), "prefix + answer is not the object begun")
    return json.dumps(value)[:60]


@check("partial", "streamed content excludes the prefix")
def streamed_excludes_prefix(t: Target, model: str) -> None:
    try:
        chunks = t.stream_json(CHAT, _body(t, model, TEXT_PREFIX, stream=True)).events
    except Failed as exc:
        _declined(400 if str(exc).startswith("HTTP 400:") else 0, str(exc))
        raise
    text = "".join((c["choices"][0].get("delta") or {}).get("content") or "" for c in chunks if c.get("choices"))
    expect(bool(text.strip()), "the streamed answer is empty")
    expect(not text.lstrip().startswith(TEXT_PREFIX), f"the streamed answer repeats the prefix: {text[:60]!r}")


@check("partial", "misplaced partial refused")
def misplaced(t: Target, model: str) -> None:
    early = [{"role": "assistant", "content": "Hi", "partial": True}, ASK]
    base = {"model": model, "max_completion_tokens": 1}
    t.refused(CHAT, {**base, "messages": early}, param="messages[0].partial")
    t.refused(CHAT, {**base, "messages": [{**ASK, "partial": True}]}, param="messages[0].partial")
