"""Streams that take a while: the first event awaited for a grace period (a refusal within it is
a plain HTTP error), then the headers sent and keep-alives while nothing else is; a failure
after the headers is the door's own failure event, never a cut connection."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from typing import Any

from kimi_server.engines.scripted import Script, ScriptedEngine
from kimi_server.engines.types import ContentDelta, EngineEvent, GenerationRequest
from kimi_server.errors import EngineUnavailableError
from tests.conftest import ScriptedApp
from tests.responses_util import parse_sse

CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
# Events slower than the grace and the keep-alive interval: keep-alives come between them.
SLOW: dict[str, Any] = {"stream_first_event_grace": 0.05, "stream_keep_alive": 0.05}


def chat_body(**kw: Any) -> dict[str, Any]:
    return {"model": "kimi-k3.1-pro", "messages": [{"role": "user", "content": "hi"}], "stream": True, **kw}


def responses_body(**kw: Any) -> dict[str, Any]:
    return {"model": "kimi-k3.1-pro", "input": "hi", "stream": True, **kw}


def test_slow_chat_stream_sends_comments_and_still_parses(scripted_app: ScriptedApp) -> None:
    engine = ScriptedEngine(script=Script(delay=0.3))
    with scripted_app(engine, **SLOW) as c:
        resp = c.post(CHAT, json=chat_body())
    assert resp.status_code == 200
    text = resp.text
    # Keep-alives go out before the first reasoning: the client hears from the server while the
    # prompt is read.
    assert text.index(": keep-alive\n\n") < text.index("reasoning_content")
    data = [line[6:] for line in text.split("\n") if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert content == "Hello there."


def test_fast_stream_sends_no_comment(scripted_app: ScriptedApp) -> None:
    with scripted_app(ScriptedEngine(), stream_keep_alive=5.0) as c:
        resp = c.post(CHAT, json=chat_body())
    assert resp.status_code == 200 and ": keep-alive" not in resp.text


class LateFailure(ScriptedEngine):
    """Fails after ``delay`` seconds, before any event (a prompt read for long, then refused)."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[EngineEvent, None]:
        await asyncio.sleep(self.delay)
        raise RuntimeError("scripted failure")
        yield ContentDelta("never")  # an async generator, like every engine's


def _refuse_late(delay: float) -> ScriptedEngine:
    return LateFailure(delay)


def test_refusal_within_the_grace_is_an_http_error(scripted_app: ScriptedApp) -> None:
    engine = ScriptedEngine()

    def refuse(_: GenerationRequest) -> None:
        raise EngineUnavailableError("The model is busy.", retry_after=7)

    engine.on_generate = refuse
    with scripted_app(engine, stream_first_event_grace=5.0) as c:
        resp = c.post(CHAT, json=chat_body())
    assert resp.status_code == 503 and resp.headers["retry-after"] == "7"
    assert resp.json()["error"]["message"] == "The model is busy."


def test_failure_after_the_grace_is_the_chat_error_event(scripted_app: ScriptedApp) -> None:
    with scripted_app(_refuse_late(0.3), **SLOW) as c:
        resp = c.post(CHAT, json=chat_body())
    assert resp.status_code == 200
    data = [line[6:] for line in resp.text.split("\n") if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    error = json.loads(data[-2])["error"]
    assert error["type"] == "server_error" and "scripted" not in error["message"]


def test_failure_after_the_grace_is_response_failed(scripted_app: ScriptedApp) -> None:
    with scripted_app(_refuse_late(0.3), **SLOW) as c:
        resp = c.post(RESPONSES, json=responses_body())
    assert resp.status_code == 200
    events = parse_sse(resp.text)
    assert [e["type"] for e in events] == ["response.created", "response.in_progress", "response.failed"]
    failed = events[-1]["response"]
    assert failed["status"] == "failed" and failed["error"]["code"] == "server_error"
    assert [e["sequence_number"] for e in events] == [0, 1, 2]


def test_slow_responses_stream_completes_with_comments(scripted_app: ScriptedApp) -> None:
    with scripted_app(ScriptedEngine(script=Script(delay=0.2)), **SLOW) as c:
        resp = c.post(RESPONSES, json=responses_body())
    assert resp.status_code == 200 and ": keep-alive\n\n" in resp.text
    events = parse_sse(resp.text)
    assert events[-1]["type"] == "response.completed"
    assert events[-1]["response"]["output"][-1]["content"][0]["text"] == "Hello there."
