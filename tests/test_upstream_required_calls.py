"""A forced ``tool_choice`` on an upstream said to keep it itself ("native"), which answers text
anyway: the text never reaches the client; the upstream is asked once more for a JSON answer
only a call satisfies, and the client gets the call, or a 502 ``upstream_no_tool_call``. Over a
real socket, through the openai SDK."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
import pytest

from kimi_server.settings import UpstreamCapabilities
from tests.upstreams.fake import Conn, FakeUpstream, chunk
from tests.upstreams.front import config, front

PARAMS = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS: Any = [
    {"type": "function", "function": {"name": "get_weather", "parameters": PARAMS}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
]
ASK: Any = [{"role": "user", "content": "Weather in Paris?"}]
NAMED: Any = {"type": "function", "function": {"name": "get_weather"}}
FIRST_USAGE = {"prompt_tokens": 30, "completion_tokens": 12, "total_tokens": 42}
SECOND_USAGE = {"prompt_tokens": 31, "completion_tokens": 9, "total_tokens": 40}
JSON_CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'


async def end(c: Conn, reason: str, usage: dict[str, int]) -> None:
    await c.event(chunk({}, reason))
    await c.event({**chunk({}), "choices": [], "usage": usage})
    await c.done()


async def text_then_json(body: dict[str, Any], c: Conn) -> None:
    """Ignores a native forced choice (thinks, then writes text); follows a JSON Schema."""
    await c.head()
    if "response_format" not in body:
        await c.event(chunk({"reasoning_content": "Thinking about Paris."}))
        await c.event(chunk({"content": "It is sunny in Paris."}))
        return await end(c, "stop", FIRST_USAGE)
    await c.event(chunk({"reasoning_content": "Again."}))
    for i in range(0, len(JSON_CALL), 7):
        await c.event(chunk({"content": JSON_CALL[i : i + 7]}))
    await end(c, "stop", SECOND_USAGE)


async def always_text(body: dict[str, Any], c: Conn) -> None:
    await c.head()
    await c.event(chunk({"content": "I would rather talk."}))
    await end(c, "stop", FIRST_USAGE)


async def other_function(body: dict[str, Any], c: Conn) -> None:
    """Calls get_time, whatever was named; follows a JSON Schema."""
    if "response_format" in body:
        return await text_then_json(body, c)
    await c.head()
    call = {"index": 0, "id": "call_x", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}
    await c.event(chunk({"tool_calls": [call]}))
    await end(c, "tool_calls", FIRST_USAGE)


async def words_then_call(body: dict[str, Any], c: Conn) -> None:
    """Says a few words before the call it was asked for."""
    await c.head()
    await c.event(chunk({"content": "Let me look."}))
    call = {"index": 0, "id": "call_y", "type": "function", "function": {"name": "get_weather", "arguments": ""}}
    await c.event(chunk({"tool_calls": [call]}))
    await c.event(chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": "Paris"}'}}]}))
    await end(c, "tool_calls", FIRST_USAGE)


def create(f: Any, choice: Any = "required", **extra: Any) -> Any:
    return f.sdk.chat.completions.create(model="kimi-k3.1-pro", messages=ASK, tools=TOOLS, tool_choice=choice, **extra)


@pytest.mark.parametrize("choice", ["required", NAMED], ids=["required", "named"])
def test_a_text_answer_is_asked_again_under_a_json_schema(tmp_path: Path, choice: Any) -> None:
    with FakeUpstream(text_then_json) as up, front(tmp_path, config(up.url, dialect="openai")) as f:
        resp = create(f, choice)
    first, second = up.bodies
    assert first["tool_choice"] == choice and "response_format" not in first
    assert second["tool_choice"] == "none" and second["response_format"]["type"] == "json_schema"
    out = resp.choices[0]
    assert out.finish_reason == "tool_calls"
    assert not out.message.content  # the first answer's text is not shown
    [call] = out.message.tool_calls or []
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    # Both answers were generated for this request: both are counted.
    assert resp.usage is not None
    assert (resp.usage.prompt_tokens, resp.usage.completion_tokens) == (61, 21)


def test_streamed_the_reasoning_shows_once_and_the_retry_thinks_no_more(tmp_path: Path) -> None:
    with FakeUpstream(text_then_json) as up, front(tmp_path, config(up.url, dialect="vllm")) as f:
        chunks = list(create(f, stream=True, stream_options={"include_usage": True}))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    reasoning = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas)
    assert reasoning == "Thinking about Paris."
    assert not "".join(d.content or "" for d in deltas)
    calls = [t for d in deltas for t in d.tool_calls or []]
    assert calls[0].function is not None and calls[0].function.name == "get_weather"
    assert json.loads("".join(t.function.arguments or "" for t in calls if t.function)) == {"city": "Paris"}
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]
    # The client has seen reasoning: the second request switches the model's thinking off.
    assert up.bodies[1]["chat_template_kwargs"] == {"thinking": False}
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 21


def test_a_call_of_another_function_than_the_named_one_is_asked_again(tmp_path: Path) -> None:
    with FakeUpstream(other_function) as up, front(tmp_path, config(up.url, dialect="sglang")) as f:
        resp = create(f, NAMED)
    [call] = resp.choices[0].message.tool_calls or []
    assert call.function.name == "get_weather"
    assert len(up.bodies) == 2


def test_words_before_the_call_keep_their_place(tmp_path: Path) -> None:
    with FakeUpstream(words_then_call) as up, front(tmp_path, config(up.url, dialect="openai")) as f:
        chunks = list(create(f, stream=True))
    assert len(up.bodies) == 1  # a call came: nothing asked again
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    kinds = ["text" if d.content else "call" for d in deltas if d.content or d.tool_calls]
    assert kinds[0] == "text" and set(kinds[1:]) == {"call"}
    assert "".join(d.content or "" for d in deltas) == "Let me look."


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_no_call_after_the_second_answer_either_is_a_502(tmp_path: Path, stream: bool) -> None:
    body = {"model": "kimi-k3.1-pro", "messages": ASK, "tools": TOOLS, "tool_choice": "required", "stream": stream}
    with FakeUpstream(always_text) as up, front(tmp_path, config(up.url, dialect="openai")) as f:
        r = f.http.post("/v1/chat/completions", json=body)
    assert len(up.bodies) == 2
    if not stream:
        assert r.status_code == 502
        err = r.json()["error"]
    else:
        # Nothing had gone out yet: the stream is refused before it starts, or carries the error.
        events = [line[6:] for line in r.text.splitlines() if line.startswith("data: {")]
        err = r.json()["error"] if r.status_code == 502 else json.loads(events[-1])["error"]
        assert "I would rather talk" not in r.text
    assert err["code"] == "upstream_no_tool_call" and err["type"] == "server_error"
    assert "tool call" in err["message"]


def test_an_upstream_without_json_schema_is_not_asked_again(tmp_path: Path) -> None:
    caps = UpstreamCapabilities(json_schema=False)
    with (
        FakeUpstream(always_text) as up,
        front(tmp_path, config(up.url, dialect="moonshot", capabilities=caps)) as f,
        pytest.raises(openai.InternalServerError) as caught,
    ):
        create(f)
    assert caught.value.status_code == 502
    assert isinstance(caught.value.body, dict) and caught.value.body["code"] == "upstream_no_tool_call"
    assert len(up.bodies) == 1
