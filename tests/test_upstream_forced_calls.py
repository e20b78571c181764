"""``tool_choice`` "required" or a named function on each kind of upstream, over a real socket:
an upstream that constrains calls itself gets the choice as is; one that does not (llama.cpp's
server, or any route set so) gets a JSON Schema answer that is read back into a tool call,
streamed as it arrives; one that can do neither is refused with a 400 before anything leaves;
an upstream that never finishes ends at its deadline."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
from openai.types.chat import ChatCompletionNamedToolChoiceParam
from openai.types.responses import ResponseCompletedEvent

from kimi_server.engines.types import ToolSpec
from kimi_server.engines.upstream.forced_calls import call_schema
from kimi_server.settings import UpstreamCapabilities
from tests.upstreams.fake import Conn, FakeUpstream, chunk
from tests.upstreams.front import config, front

PARAMS = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOLS: Any = [
    {"type": "function", "function": {"name": "get_weather", "parameters": PARAMS, "strict": True}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
]
ASK: Any = [{"role": "user", "content": "Weather in Paris for two days?"}]
ANSWER = '{"name": "get_weather", "arguments": {"city": "Pa\\"ris}", "days": 2}}'
USAGE = {"prompt_tokens": 30, "completion_tokens": 21, "total_tokens": 51}


async def json_answer(body: dict[str, Any], c: Conn) -> None:
    """llama.cpp's server under a JSON Schema: reasoning, then the JSON a few characters at a time."""
    await c.head()
    await c.event(chunk({"reasoning_content": "A call it is."}))
    for i in range(0, len(ANSWER), 3):
        await c.event(chunk({"content": ANSWER[i : i + 3]}))
    await c.event(chunk({}, "stop"))
    await c.event({**chunk({}), "choices": [], "usage": USAGE})
    await c.done()


async def native_call(body: dict[str, Any], c: Conn) -> None:
    """vLLM under a forced choice: the call as tool-call deltas, of the function named if one is."""
    choice = body.get("tool_choice")
    name = choice["function"]["name"] if isinstance(choice, dict) else "get_weather"
    args = '{"city": "Paris", "days": 2}' if name == "get_weather" else "{}"
    await c.head()
    await c.event(chunk({"reasoning_content": "A call it is."}))
    call = {"index": 0, "id": "call_up1", "type": "function", "function": {"name": name, "arguments": ""}}
    await c.event(chunk({"tool_calls": [call]}))
    await c.event(chunk({"tool_calls": [{"index": 0, "function": {"arguments": args}}]}))
    await c.event(chunk({}, "tool_calls"))
    await c.event({**chunk({}), "choices": [], "usage": USAGE})
    await c.done()


async def prose(body: dict[str, Any], c: Conn) -> None:
    """An upstream that ignored the format and wrote text."""
    await c.head()
    await c.event(chunk({"content": "It is sunny."}))
    await c.event(chunk({}, "stop"))
    await c.done()


def upstream_call(body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return body["tool_choice"], body.get("response_format") or {}


@pytest.mark.parametrize("dialect", ["vllm", "sglang", "moonshot", "openai"])
def test_native_dialects_get_the_choice_as_is(tmp_path: Path, dialect: str) -> None:
    with FakeUpstream(native_call) as up, front(tmp_path, config(up.url, dialect=dialect)) as f:
        f.sdk.chat.completions.create(model="kimi-k3.1-pro", messages=ASK, tools=TOOLS, tool_choice="required")
        named: Any = {"type": "function", "function": {"name": "get_time"}}
        f.sdk.chat.completions.create(model="kimi-k3.1-pro", messages=ASK, tools=TOOLS, tool_choice=named)
    assert [upstream_call(b) for b in up.bodies] == [("required", {}), (named, {})]


def test_llamacpp_gets_a_json_schema_only_a_call_satisfies(tmp_path: Path) -> None:
    with FakeUpstream(json_answer) as up, front(tmp_path, config(up.url, dialect="llamacpp")) as f:
        f.sdk.chat.completions.create(model="kimi-k3.1-pro", messages=ASK, tools=TOOLS, tool_choice="required")
        # tool_choice auto stays unconstrained.
        f.sdk.chat.completions.create(model="kimi-k3.1-pro", messages=ASK, tools=TOOLS, tool_choice="auto")
    forced, auto = up.bodies
    assert forced["tool_choice"] == "none" and len(forced["tools"]) == 2
    assert "parallel_tool_calls" not in forced
    fmt = forced["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["strict"] is True
    schema = fmt["json_schema"]["schema"]
    jsonschema.validate(json.loads(ANSWER), schema)
    jsonschema.validate({"name": "get_time", "arguments": {}}, schema)
    for wrong in ({"name": "other", "arguments": {}}, {"name": "get_weather", "arguments": {"city": "x"}}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(wrong, schema)
    assert auto["tool_choice"] == "auto" and "response_format" not in auto


def test_the_json_answer_comes_back_as_a_tool_call(tmp_path: Path) -> None:
    with FakeUpstream(json_answer) as up, front(tmp_path, config(up.url, dialect="llamacpp")) as f:
        resp = f.sdk.chat.completions.create(model="kimi-k3.1-pro", messages=ASK, tools=TOOLS, tool_choice="required")
        stream = f.sdk.chat.completions.create(
            model="kimi-k3.1-pro",
            messages=ASK,
            tools=TOOLS,
            tool_choice="required",
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
    choice = resp.choices[0]
    [call] = choice.message.tool_calls or []
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": 'Pa"ris}', "days": 2}
    assert (choice.message.model_extra or {})["reasoning_content"] == "A call it is."  # a Kimi field
    assert resp.usage is not None and (resp.usage.prompt_tokens, resp.usage.completion_tokens) == (30, 21)

    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    assert (deltas[0].id or "").startswith("call_") and deltas[0].function is not None
    assert deltas[0].function.name == "get_weather"
    assert len(deltas) > 3  # the arguments streamed in pieces, not in one delta at the end
    assert "".join(d.function.arguments or "" for d in deltas if d.function) == call.function.arguments
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["tool_calls"]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 21


def test_the_json_answer_is_a_function_call_item_in_responses(tmp_path: Path) -> None:
    tools: Any = [{"type": "function", **t["function"]} for t in TOOLS]
    with FakeUpstream(json_answer) as up, front(tmp_path, config(up.url, dialect="llamacpp")) as f:
        events = list(
            f.sdk.responses.create(
                model="kimi-k3.1-pro", input="Weather in Paris?", tools=tools, tool_choice="required", stream=True
            )
        )
    types = [e.type for e in events]
    assert "response.function_call_arguments.delta" in types and types[-1] == "response.completed"
    assert isinstance(events[-1], ResponseCompletedEvent)
    final = events[-1].response
    [call] = [item for item in final.output if item.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments)["days"] == 2
    assert not [item for item in final.output if item.type == "message"]


def test_a_route_may_set_how_forced_calls_are_kept(tmp_path: Path) -> None:
    caps = UpstreamCapabilities(forced_tool_calls="json_schema")
    with FakeUpstream(json_answer) as up, front(tmp_path, config(up.url, dialect="vllm", capabilities=caps)) as f:
        resp = f.sdk.chat.completions.create(model="kimi-k3.1-pro", messages=ASK, tools=TOOLS, tool_choice="required")
    assert up.bodies[0]["tool_choice"] == "none" and "response_format" in up.bodies[0]
    assert resp.choices[0].message.tool_calls


@pytest.mark.parametrize(
    ("dialect", "caps"),
    [
        ("vllm", UpstreamCapabilities(forced_tool_calls="none")),
        ("llamacpp", UpstreamCapabilities(json_schema=False)),
    ],
    ids=["declared-none", "no-json-schema"],
)
def test_an_upstream_that_can_do_neither_is_refused_at_once(
    tmp_path: Path, dialect: str, caps: UpstreamCapabilities
) -> None:
    with FakeUpstream(json_answer) as up, front(tmp_path, config(up.url, dialect=dialect, capabilities=caps)) as f:
        named: ChatCompletionNamedToolChoiceParam = {"type": "function", "function": {"name": "get_time"}}
        for choice in ("required", named):
            with pytest.raises(openai.BadRequestError) as info:
                f.sdk.chat.completions.create(
                    model="kimi-k3.1-pro",
                    messages=ASK,
                    tools=TOOLS,
                    tool_choice=choice,
                    stream=True,
                )
            err = info.value.body
            assert isinstance(err, dict)
            assert err["param"] == "tool_choice" and err["code"] == "unsupported_parameter"
        # auto still works there.
        resp = f.sdk.chat.completions.create(model="kimi-k3.1-pro", messages=ASK, tools=TOOLS)
    assert resp.choices[0].finish_reason in ("stop", "tool_calls")
    assert len(up.bodies) == 1


def test_an_answer_that_is_no_call_is_an_error_not_a_text(tmp_path: Path) -> None:
    with FakeUpstream(prose) as up, front(tmp_path, config(up.url, dialect="llamacpp")) as f:
        r = f.http.post(
            "/v1/chat/completions",
            json={"model": "kimi-k3.1-pro", "messages": ASK, "tools": TOOLS, "tool_choice": "required"},
        )
    assert r.status_code == 502
    assert set(r.json()["error"]) >= {"message", "type", "code"}
    assert len(up.bodies) == 1  # not retried: the same answer would come back


def test_call_schema_keeps_each_tools_references() -> None:
    tree = {
        "type": "object",
        "properties": {"root": {"$ref": "#/$defs/node"}},
        "required": ["root"],
        "$defs": {
            "node": {
                "type": "object",
                "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
                "required": ["kids"],
                "additionalProperties": False,
            }
        },
    }
    schema = call_schema((ToolSpec("tree", parameters=tree), ToolSpec("flat", parameters=PARAMS)), None)
    jsonschema.validate({"name": "tree", "arguments": {"root": {"kids": [{"kids": []}]}}}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"name": "tree", "arguments": {"root": {"kids": [{"kid": []}]}}}, schema)
    only = call_schema((ToolSpec("tree", parameters=tree), ToolSpec("flat", parameters=PARAMS)), "flat")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"name": "tree", "arguments": {"root": {"kids": []}}}, only)


async def keep_alive_forever(body: dict[str, Any], c: Conn) -> None:
    await c.head()
    while True:
        await c.raw(b": keep-alive\n\n")
        await asyncio.sleep(0.2)


def test_an_upstream_that_never_finishes_ends_at_its_deadline(tmp_path: Path) -> None:
    with FakeUpstream(keep_alive_forever) as up, front(tmp_path, config(up.url, total_timeout=1.5, retries=0)) as f:
        r = f.http.post("/v1/chat/completions", json={"model": "kimi-k3.1-pro", "messages": ASK})
    assert r.status_code == 504
    assert r.json()["error"]["code"]
