"""Tools declared in system messages ("dynamic tools") over HTTP, against the scripted engine:
each invalid form a 400 naming its field, and the accepted forms reach the engine as tools in
force, on both endpoints, streamed or not, under both contract profiles."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from kimi_server.engines.scripted import ScriptedEngine
from kimi_server.engines.types import ToolCallDelta
from tests.conftest import ScriptedApp

CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
MODEL = "kimi-k3.1-pro"
PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


@pytest.fixture(params=["evolink", "moonshot"])
def client(request: pytest.FixtureRequest, engine: ScriptedEngine, scripted_app: ScriptedApp) -> Iterator[TestClient]:
    with scripted_app(engine, contract=request.param) as c:
        yield c


def fn(name: str = "get_weather", **extra: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": PARAMS, **extra}}


def flat(name: str = "get_weather") -> dict[str, Any]:
    return {"type": "function", "name": name, "parameters": PARAMS}


def declare(*tools: Any, role: str = "system", **extra: Any) -> dict[str, Any]:
    return {"role": role, "content": "", "tools": list(tools), **extra}


USER = {"role": "user", "content": "Weather in Paris?"}

# (case, messages, request tools, the field named)
CHAT_INVALID: list[tuple[str, list[Any], list[Any] | None, str]] = [
    ("user message", [{**USER, "tools": [fn()]}], None, "messages[0].tools"),
    (
        "assistant message",
        [USER, {"role": "assistant", "content": "Hm.", "tools": [fn()]}, USER],
        None,
        "messages[1].tools",
    ),
    (
        "tool message",
        [USER, {"role": "tool", "tool_call_id": "c1", "content": "x", "tools": [fn()]}],
        None,
        "messages[1].tools",
    ),
    (
        "content and tools",
        [{"role": "system", "content": "Be brief.", "tools": [fn()]}, USER],
        None,
        "messages[0].content",
    ),
    ("missing type", [declare({"function": fn()["function"]}), USER], None, "messages[0].tools[0].type"),
    ("missing function", [declare({"type": "function"}), USER], None, "messages[0].tools[0].function"),
    (
        "missing name",
        [declare({"type": "function", "function": {"parameters": PARAMS}}), USER],
        None,
        "messages[0].tools[0].function.name",
    ),
    ("leading digit", [declare(fn("1weather")), USER], None, "messages[0].tools[0].function.name"),
    ("bad characters", [declare(fn("get weather!")), USER], None, "messages[0].tools[0].function.name"),
    ("dot", [declare(fn("get.weather")), USER], None, "messages[0].tools[0].function.name"),
    ("empty name", [declare(fn("")), USER], None, "messages[0].tools[0].function.name"),
    ("257 characters", [declare(fn("w" * 257)), USER], None, "messages[0].tools[0].function.name"),
    (
        "unknown type",
        [declare({"type": "retrieval", "function": {"name": "x"}}), USER],
        None,
        "messages[0].tools[0].type",
    ),
    ("web search there", [declare({"type": "web_search"}), USER], None, "messages[0].tools[0].type"),
    ("not an array", [declare(role="system") | {"tools": fn()}, USER], None, "messages[0].tools"),
    ("non-object entry", [declare("get_weather"), USER], None, "messages[0].tools[0]"),
    (
        "function not an object",
        [declare({"type": "function", "function": "get_weather"}), USER],
        None,
        "messages[0].tools[0].function",
    ),
    ("twice in one message", [declare(fn(), fn()), USER], None, "messages[0].tools[1].function.name"),
    ("twice across messages", [declare(fn()), USER, declare(fn()), USER], None, "messages[2].tools[0].function.name"),
    ("in tools and a message", [declare(fn()), USER], [fn()], "messages[0].tools[0].function.name"),
    (
        "bad schema",
        [declare(fn(parameters={"type": "array"})), USER],
        None,
        "messages[0].tools[0].function.parameters.type",
    ),
]


def refused(resp: Any, param: str) -> None:
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param, err


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("case", "messages", "tools", "param"), CHAT_INVALID, ids=[c[0] for c in CHAT_INVALID])
def test_chat_invalid_declarations(
    client: TestClient,
    case: str,
    messages: list[Any],
    tools: list[Any] | None,
    param: str,
    stream: bool,
) -> None:
    body: dict[str, Any] = {"model": MODEL, "messages": messages, "stream": stream}
    if tools is not None:
        body["tools"] = tools
    refused(client.post(CHAT, json=body), param)


def item(role: str, tools: Any, content: Any = "") -> dict[str, Any]:
    return {"type": "message", "role": role, "content": content, "tools": tools}


RESP_USER = {"role": "user", "content": "Weather in Paris?"}

RESPONSES_INVALID: list[tuple[str, list[Any], list[Any] | None, str]] = [
    ("user item", [{**RESP_USER, "tools": [flat()]}], None, "input[0].tools"),
    (
        "assistant item",
        [RESP_USER, {"role": "assistant", "content": "Hm.", "tools": [flat()]}, RESP_USER],
        None,
        "input[1].tools",
    ),
    ("content and tools", [item("developer", [flat()], "Be brief."), RESP_USER], None, "input[0].content"),
    ("missing type", [item("system", [{"name": "x"}]), RESP_USER], None, "input[0].tools[0].type"),
    ("missing name", [item("system", [{"type": "function"}]), RESP_USER], None, "input[0].tools[0].name"),
    ("leading digit", [item("system", [flat("9lives")]), RESP_USER], None, "input[0].tools[0].name"),
    ("bad characters", [item("system", [flat("a/b")]), RESP_USER], None, "input[0].tools[0].name"),
    ("empty name", [item("system", [flat("")]), RESP_USER], None, "input[0].tools[0].name"),
    ("257 characters", [item("system", [flat("n" * 257)]), RESP_USER], None, "input[0].tools[0].name"),
    ("unknown type", [item("system", [{"type": "custom", "name": "x"}]), RESP_USER], None, "input[0].tools[0].type"),
    ("not an array", [item("system", "get_weather"), RESP_USER], None, "input[0].tools"),
    ("non-object entry", [item("system", [7]), RESP_USER], None, "input[0].tools[0]"),
    ("twice in one item", [item("system", [flat(), flat()]), RESP_USER], None, "input[0].tools[1].name"),
    (
        "twice across items",
        [item("system", [flat()]), RESP_USER, item("developer", [flat()]), RESP_USER],
        None,
        "input[2].tools[0].name",
    ),
    ("in tools and an item", [item("system", [flat()]), RESP_USER], [flat()], "input[0].tools[0].name"),
    ("user item without content", [{"role": "user"}], None, "input[0].content"),
]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("case", "items", "tools", "param"), RESPONSES_INVALID, ids=[c[0] for c in RESPONSES_INVALID])
def test_responses_invalid_declarations(
    client: TestClient, case: str, items: list[Any], tools: list[Any] | None, param: str, stream: bool
) -> None:
    body: dict[str, Any] = {"model": MODEL, "input": items, "stream": stream}
    if tools is not None:
        body["tools"] = tools
    refused(client.post(RESPONSES, json=body), param)


def test_request_tools_follow_the_same_name_rule(client: TestClient) -> None:
    """Each endpoint names the field where its tools keep the name: nested in chat, flat in
    Responses."""
    body = {"model": MODEL, "messages": [USER], "tools": [fn("2fast")]}
    refused(client.post(CHAT, json=body), "tools[0].function.name")
    body = {"model": MODEL, "input": "Hi", "tools": [flat("2fast")]}
    refused(client.post(RESPONSES, json=body), "tools[0].name")


def test_name_length_follows_the_profile(client: TestClient) -> None:
    """evolink keeps the 64 characters OpenAI-compatible clients and upstreams accept; moonshot
    Moonshot's 256."""
    moonshot = client.get("/v1/models").json()["data"][0]["contract"] == "moonshot"
    body = {"model": MODEL, "messages": [declare(fn("n" * 100)), USER], "tool_choice": "required"}
    resp = client.post(CHAT, json=body)
    if moonshot:
        assert resp.status_code == 200, resp.text
    else:
        refused(resp, "messages[0].tools[0].function.name")
    refused(
        client.post(CHAT, json={**body, "messages": [declare(fn("n" * 257)), USER]}),
        "messages[0].tools[0].function.name",
    )


def call(name: str) -> tuple[ToolCallDelta, ...]:
    return (ToolCallDelta(0, "call_1", name, '{"city": "Paris"}'),)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_chat_choice_with_only_declared_tools(
    client: TestClient, engine: ScriptedEngine, stream: bool, choice: Any
) -> None:
    engine.script.tool_calls = call("get_weather")
    messages = [
        {"role": "system", "content": "Be brief."},
        USER,
        declare(fn(description="Weather.")),
        {"role": "developer", "tools": [fn("get_time")]},
        USER,
    ]
    body = {"model": MODEL, "messages": messages, "tool_choice": choice, "stream": stream}
    resp = client.post(CHAT, json=body)
    assert resp.status_code == 200, resp.text
    assert "get_weather" in resp.text
    gen = engine.requests[-1]
    assert [t.name for t in gen.tools] == ["get_weather", "get_time"]
    assert [(m.role, m.text, [t.name for t in m.tools]) for m in gen.messages] == [
        ("system", "Be brief.", []),
        ("user", USER["content"], []),
        ("system", "", ["get_weather"]),
        ("system", "", ["get_time"]),
        ("user", USER["content"], []),
    ]
    assert gen.tools[0].description == "Weather." and gen.tools[0].parameters == PARAMS


@pytest.mark.parametrize("stream", [False, True])
def test_responses_choice_with_only_declared_tools(client: TestClient, engine: ScriptedEngine, stream: bool) -> None:
    engine.script.tool_calls = call("get_weather")
    items = [item("developer", [flat()]), RESP_USER]
    body = {"model": MODEL, "input": items, "tool_choice": "required", "stream": stream}
    resp = client.post(RESPONSES, json=body)
    assert resp.status_code == 200, resp.text
    assert '"function_call"' in resp.text and "get_weather" in resp.text
    gen = engine.requests[-1]
    assert [t.name for t in gen.tools] == ["get_weather"] and gen.tools[0].strict
    assert [t.name for t in gen.messages[0].tools] == ["get_weather"]


def test_declared_and_request_tools_together(client: TestClient, engine: ScriptedEngine) -> None:
    body = {
        "model": MODEL,
        "messages": [USER, declare(fn()), USER],
        "tools": [fn("get_time")],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    }
    assert client.post(CHAT, json=body).status_code == 200
    assert [t.name for t in engine.requests[-1].tools] == ["get_time", "get_weather"]


def test_choice_none_hides_declarations(client: TestClient, engine: ScriptedEngine) -> None:
    body = {"model": MODEL, "messages": [declare(fn()), USER], "tool_choice": "none"}
    assert client.post(CHAT, json=body).status_code == 200
    gen = engine.requests[-1]
    assert gen.tools == () and [m.role for m in gen.messages] == ["user"]


def test_allowed_tools_may_name_declared_ones(client: TestClient, engine: ScriptedEngine) -> None:
    choice = {"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "get_time"}]}
    items = [item("system", [flat(), flat("get_time")]), RESP_USER]
    resp = client.post(RESPONSES, json={"model": MODEL, "input": items, "tool_choice": choice})
    assert resp.status_code == 200, resp.text
    gen = engine.requests[-1]
    assert [t.name for t in gen.tools] == ["get_time"]
    assert [t.name for t in gen.messages[0].tools] == ["get_time"]


def test_empty_declaration_is_accepted(client: TestClient, engine: ScriptedEngine) -> None:
    contents: list[Any] = [None, "", []]
    for content in contents:
        msg: dict[str, Any] = {"role": "system", "tools": []}
        if content is not None:
            msg["content"] = content
        resp = client.post(CHAT, json={"model": MODEL, "messages": [msg, USER]})
        assert resp.status_code == 200, resp.text
    refused(
        client.post(CHAT, json={"model": MODEL, "messages": [declare(), USER], "tool_choice": "required"}),
        "tool_choice",
    )
