"""The Messages door over real HTTP, through the pinned ``anthropic`` SDK, on the scripted engine:
both paths (``/v1/messages`` and ``/anthropic/v1/messages``), both credentials, the stream
rebuilt by the SDK's own accumulator, tools, thinking sent back, count_tokens, the model list,
each error type in Anthropic's shape with its headers, and the ledger row of each request."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from kimi_server.engines.scripted import Script, ScriptedEngine
from kimi_server.engines.types import ToolCallDelta
from tests.gateway_util import ADMIN_KEY, STATIC_KEY, make_app, serve

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
HI: Any = [{"role": "user", "content": "Hi"}]


@pytest.fixture
def engine() -> ScriptedEngine:
    return ScriptedEngine()


@pytest.fixture
def url(tmp_path: Path, engine: ScriptedEngine) -> Iterator[str]:
    app, _ = make_app(tmp_path, engine, max_body_bytes=200_000)
    with serve(app) as base:
        yield base


def client(url: str, key: str = STATIC_KEY, prefix: str = "/anthropic") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url + prefix, api_key=key, max_retries=0, timeout=60)


def ledger(tmp: Path) -> list[dict[str, Any]]:
    with sqlite3.connect(tmp / "data" / "kimi.db") as db:
        db.row_factory = sqlite3.Row
        return [dict(row) for row in db.execute("SELECT * FROM usage ORDER BY created_at")]


def test_create_on_both_paths_with_either_credential(url: str, tmp_path: Path) -> None:
    for prefix in ("", "/anthropic"):
        message = client(url, prefix=prefix).messages.create(
            model="kimi-k3.1-pro", max_tokens=200, messages=HI, metadata={"user_id": "user-7"}
        )
        assert message.id.startswith("msg_") and message.model == "kimi-k3.1-pro"
        assert [b.type for b in message.content] == ["thinking", "text"]
        thinking, text = message.content
        assert isinstance(thinking, anthropic.types.ThinkingBlock) and isinstance(text, anthropic.types.TextBlock)
        assert thinking.thinking == "Let me think." and thinking.signature
        assert text.text == "Hello there." and message.stop_reason == "end_turn"
    bearer = httpx.post(
        url + "/v1/messages",
        json={"model": "kimi-k3.1-pro", "max_tokens": 50, "messages": HI},
        headers={"Authorization": f"Bearer {STATIC_KEY}", "anthropic-version": "2023-06-01", "anthropic-beta": "x"},
    )
    assert bearer.status_code == 200 and bearer.headers["request-id"].startswith("req_")
    rows = ledger(tmp_path)
    assert [r["endpoint"] for r in rows] == ["messages"] * 3
    assert [r["end_user"] for r in rows] == ["user-7", "user-7", None]
    usage = message.usage
    assert rows[1]["prompt_tokens"] == usage.input_tokens + (usage.cache_read_input_tokens or 0) + (
        usage.cache_creation_input_tokens or 0
    )
    assert rows[1]["completion_tokens"] == usage.output_tokens


def test_claude_ids_reach_a_served_model(url: str) -> None:
    for asked, served in (("claude-opus-5-5", "kimi-k3.1-pro"), ("claude-haiku-4-5", "kimi-k3.1-pro-highspeed")):
        assert client(url).messages.create(model=asked, max_tokens=50, messages=HI).model == served


def test_stream_rebuilt_by_the_sdk_equals_the_message(url: str, engine: ScriptedEngine) -> None:
    sdk = client(url)
    with sdk.messages.stream(model="kimi-k3.1-pro", max_tokens=200, messages=HI) as stream:
        names = [event.type for event in stream]
        streamed = stream.get_final_message()
    assert names[0] == "message_start" and names[-1] == "message_stop"
    assert "message_delta" in names and names.count("content_block_start") == 2
    created = sdk.messages.create(model="kimi-k3.1-pro", max_tokens=200, messages=HI)

    # The same blocks, each thinking block with its own signature (sealed afresh each time).
    def without_signature(block: Any) -> dict[str, Any]:
        return {k: v for k, v in block.model_dump().items() if k != "signature"}

    assert [without_signature(b) for b in streamed.content] == [without_signature(b) for b in created.content]
    assert streamed.stop_reason == "end_turn" and streamed.usage.output_tokens == created.usage.output_tokens


def test_omitted_thinking_keeps_the_signature_and_comes_back(url: str) -> None:
    sdk = client(url)
    first = sdk.messages.create(
        model="kimi-k3.1-pro",
        max_tokens=200,
        messages=HI,
        thinking={"type": "adaptive", "display": "omitted"},
        output_config={"effort": "high"},
    )
    thinking = first.content[0]
    assert thinking.type == "thinking" and thinking.thinking == "" and thinking.signature
    history: list[Any] = [
        *HI,
        {"role": "assistant", "content": [thinking.model_dump(), {"type": "text", "text": "Hello there."}]},
        {"role": "user", "content": "And?"},
    ]
    assert sdk.messages.create(model="kimi-k3.1-pro", max_tokens=50, messages=history).stop_reason == "end_turn"
    forged = {**thinking.model_dump(), "signature": thinking.signature[:-6] + "AAAAAA"}
    history[1] = {"role": "assistant", "content": [forged, {"type": "text", "text": "Hello there."}]}
    with pytest.raises(anthropic.BadRequestError) as refused:
        sdk.messages.create(model="kimi-k3.1-pro", max_tokens=50, messages=history)
    error = refused.value.body["error"]  # type: ignore[index]
    assert error["type"] == "invalid_request_error" and "messages[1].content[0].signature" in error["message"]


def test_tool_use_then_tool_result(url: str, engine: ScriptedEngine) -> None:
    call = ToolCallDelta(0, id="call_1", name="get_weather", arguments='{"city": "Paris"}')
    engine.script = Script(content=(), tool_calls=(call,))
    tools: Any = [
        {
            "name": "get_weather",
            "description": "Weather of a city",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        }
    ]
    sdk = client(url)
    with sdk.messages.stream(
        model="kimi-k3.1-pro", max_tokens=200, messages=HI, tools=tools, tool_choice={"type": "any"}
    ) as stream:
        message = stream.get_final_message()
    use = message.content[-1]
    assert message.stop_reason == "tool_use" and use.type == "tool_use"
    assert use.name == "get_weather" and use.input == {"city": "Paris"}
    engine.script = Script()
    reply: Any = [
        *HI,
        {"role": "assistant", "content": [block.model_dump() for block in message.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "Sunny, 21 C"}]},
    ]
    assert sdk.messages.create(model="kimi-k3.1-pro", max_tokens=200, messages=reply, tools=tools).stop_reason == (
        "end_turn"
    )
    seen = engine.requests[-1].messages
    assert seen[-1].role == "tool" and seen[-1].tool_call_id == use.id and "Sunny" in seen[-1].text


def test_stop_sequence_named(url: str, engine: ScriptedEngine) -> None:
    engine.script = Script(content=("Hello",), stop_sequence="END")
    message = client(url).messages.create(model="kimi-k3.1-pro", max_tokens=50, messages=HI, stop_sequences=["END"])
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == "END"
    assert engine.requests[-1].stop == ("END",)


def test_count_tokens_and_models(url: str) -> None:
    sdk = client(url)
    counted = sdk.messages.count_tokens(model="claude-opus-5-5", messages=HI, system="Be brief.")
    assert counted.input_tokens > 0
    longer = sdk.messages.count_tokens(model="kimi-k3.1-pro", messages=HI, system="Be brief. " * 50)
    assert longer.input_tokens > counted.input_tokens
    page = sdk.models.list()
    assert [m.id for m in page.data][:3] == ["kimi-k3.1-pro", "kimi-k3.1-pro-highspeed", "kimi-k3"]
    assert sdk.models.retrieve("kimi-k3").type == "model"
    with pytest.raises(anthropic.NotFoundError):
        sdk.models.retrieve("kimi-nope")


def _error(exc: anthropic.APIStatusError) -> dict[str, Any]:
    body = exc.body
    assert isinstance(body, dict) and body["type"] == "error" and set(body["error"]) == {"type", "message"}
    return dict(body["error"])


def test_each_error_in_anthropic_shape(url: str, tmp_path: Path) -> None:
    sdk = client(url)
    with pytest.raises(anthropic.AuthenticationError) as unauthorised:
        client(url, key="sk-wrong").messages.create(model="kimi-k3.1-pro", max_tokens=10, messages=HI)
    assert _error(unauthorised.value)["type"] == "authentication_error"
    with pytest.raises(anthropic.BadRequestError) as bad:
        sdk.messages.create(model="kimi-k3.1-pro", max_tokens=0, messages=HI)
    assert "max_tokens" in _error(bad.value)["message"]
    unsupported: Any = [{"role": "user", "content": [{"type": "document", "source": {}}]}]
    with pytest.raises(anthropic.BadRequestError) as bad_block:
        sdk.messages.create(model="kimi-k3.1-pro", max_tokens=10, messages=unsupported)
    assert "messages[0].content[0]" in _error(bad_block.value)["message"]
    with pytest.raises(anthropic.NotFoundError) as unknown:
        sdk.messages.create(model="kimi-nope", max_tokens=10, messages=HI)
    assert _error(unknown.value)["type"] == "not_found_error"
    with pytest.raises(anthropic.APIStatusError) as too_large:
        sdk.messages.create(model="kimi-k3.1-pro", max_tokens=10, messages=[{"role": "user", "content": "x" * 300_000}])
    assert too_large.value.status_code == 413 and _error(too_large.value)["type"] == "request_too_large"
    missing = httpx.get(url + "/anthropic/v1/nothing", headers={"x-api-key": STATIC_KEY})
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"


def test_rate_limit_error_carries_anthropic_headers(url: str) -> None:
    with httpx.Client(base_url=url) as c:
        made = c.post("/admin/v1/keys", json={"name": f"k{time.monotonic_ns()}", "rpm": 1}, headers=ADMIN)
        key = str(made.json()["secret"])
    sdk = client(url, key=key)
    sdk.messages.create(model="kimi-k3.1-pro", max_tokens=10, messages=HI)
    with pytest.raises(anthropic.RateLimitError) as limited:
        sdk.messages.create(model="kimi-k3.1-pro", max_tokens=10, messages=HI)
    headers = limited.value.response.headers
    assert _error(limited.value)["type"] == "rate_limit_error" and int(headers["retry-after"]) >= 1
    assert headers["anthropic-ratelimit-requests-limit"] == "1"
    assert headers["anthropic-ratelimit-requests-remaining"] == "0"
    assert headers["anthropic-ratelimit-requests-reset"].endswith("Z")


def test_overload_is_529(tmp_path: Path) -> None:
    engine = ScriptedEngine(script=Script(delay=0.5))
    app, _ = make_app(tmp_path, engine, parallel=1, queue_max=0, queue_max_per_key=0)
    with serve(app) as base:

        async def both() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=base, headers={"x-api-key": STATIC_KEY}, timeout=60) as c:
                body = {"model": "kimi-k3.1-pro", "max_tokens": 10, "messages": HI}
                first = asyncio.ensure_future(c.post("/v1/messages", json=body))
                await asyncio.sleep(0.2)
                second = await c.post("/v1/messages", json=body)
                return [await first, second]

        done, refused = asyncio.run(both())
    assert done.status_code == 200
    assert refused.status_code == 529 and refused.json()["error"]["type"] == "overloaded_error"
    assert int(refused.headers["retry-after"]) >= 1


def test_stream_failing_midway_ends_with_an_error_event(url: str, engine: ScriptedEngine) -> None:
    engine.script = Script(fail_after=2)
    with httpx.stream(
        "POST",
        url + "/v1/messages",
        json={"model": "kimi-k3.1-pro", "max_tokens": 50, "messages": HI, "stream": True},
        headers={"x-api-key": STATIC_KEY},
    ) as resp:
        frames = [f for f in resp.read().decode().split("\n\n") if f]
    last = frames[-1].split("\n")
    assert last[0] == "event: error"
    error = json.loads(last[1][len("data: ") :])["error"]
    assert error["type"] == "api_error" and "scripted" not in error["message"]


def test_models_at_the_root_for_an_anthropic_client(url: str) -> None:
    listed = client(url, prefix="").models.list()
    assert listed.data[0].type == "model" and listed.first_id == "kimi-k3.1-pro"
    openai_shape = httpx.get(url + "/v1/models", headers={"Authorization": f"Bearer {STATIC_KEY}"}).json()
    assert openai_shape["object"] == "list" and openai_shape["data"][0]["object"] == "model"
