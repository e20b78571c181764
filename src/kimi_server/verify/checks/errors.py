"""Error shapes and statuses: ``{"error": {"message", "type", "code"}}``, 401 for a bad key,
400 for malformed input naming the field, never a server error."""

from __future__ import annotations

from kimi_server.verify.outcome import expect
from kimi_server.verify.registry import check
from kimi_server.verify.target import SAY_OK, Target, error_shape

CHAT = "/chat/completions"


@check("errors", "wrong key is 401")
def wrong_key(t: Target, model: str) -> None:
    resp = t.post(CHAT, {"model": model, "messages": SAY_OK, "max_completion_tokens": 1}, key="sk-verify-not-a-key")
    expect(resp.status_code == 401, f"HTTP {resp.status_code}")
    error_shape(resp)


@check("errors", "no key is 401")
def no_key(t: Target, model: str) -> None:
    resp = t.http.post(t.base_url + CHAT, json={"model": model, "messages": SAY_OK})
    expect(resp.status_code == 401, f"HTTP {resp.status_code}")
    error_shape(resp)


@check("errors", "unknown model")
def unknown_model(t: Target, model: str) -> str:
    resp = t.post(CHAT, {"model": "kimi-no-such-model", "messages": SAY_OK, "max_completion_tokens": 1})
    expect(resp.status_code in (400, 404), f"HTTP {resp.status_code} (400 or 404 expected)")
    error = error_shape(resp)
    return f"{resp.status_code} {error.get('code')}"


@check("errors", "malformed JSON is 400")
def malformed_json(t: Target, model: str) -> None:
    for path in (CHAT, "/responses"):
        resp = t.post(path, None, raw=b'{"model": "' + model.encode() + b'", "messages": [')
        expect(resp.status_code == 400, f"{path}: HTTP {resp.status_code}")
        error_shape(resp)


@check("errors", "missing and mistyped fields name the field")
def field_errors(t: Target, model: str) -> None:
    t.refused(CHAT, {"model": model}, param="messages")
    t.refused(
        CHAT, {"model": model, "messages": SAY_OK, "max_completion_tokens": "many"}, param="max_completion_tokens"
    )
    t.refused(CHAT, {"model": model, "messages": [{"role": "robot", "content": "hi"}]}, param="messages[0]")
    t.refused(CHAT, {"model": model, "messages": SAY_OK, "stream": "yes"}, param="stream")


@check("errors", "wrong method")
def wrong_method(t: Target, model: str) -> str:
    resp = t.http.get(t.base_url + CHAT, headers={"Authorization": f"Bearer {t.key}"})
    expect(resp.status_code in (404, 405), f"HTTP {resp.status_code} (404 or 405 expected)")
    error_shape(resp)
    return str(resp.status_code)
