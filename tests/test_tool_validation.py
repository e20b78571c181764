"""Bad tools, tool choices and response formats get a 400 that names the field, before any
generation starts (the scripted engine records every request it is handed)."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from kimi_server.engines.scripted import ScriptedEngine
from kimi_server.serving.schema_check import MAX_COUNT, MAX_DEPTH, MAX_SCHEMA_BYTES

OBJ: dict[str, Any] = {"type": "object", "properties": {"city": {"type": "string"}}}


def fn(name: str = "get_weather", parameters: Any = OBJ, **extra: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": parameters, **extra}}


def fmt(schema: Any = OBJ, **extra: Any) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "out", "schema": schema, **extra}}


def post(client: TestClient, **body: Any) -> Any:
    payload = {
        "model": "kimi-k3.1-pro",
        "messages": [{"role": "user", "content": "hi"}],
        **body,
    }
    return client.post("/v1/chat/completions", json=payload)


def assert_400(resp: Any, param: str, *words: str) -> None:
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert set(error) >= {"message", "type", "code"}
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param, error
    assert param in error["message"] or param.split(".")[-1] in error["message"], error
    for word in words:
        assert word in error["message"], error


def nest(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


BAD_TOOLS: list[tuple[str, dict[str, Any], str, tuple[str, ...]]] = [
    ("duplicate", {"tools": [fn(), fn()]}, "tools[1].function.name", ("Duplicate",)),
    ("bad name", {"tools": [fn("get weather!")]}, "tools[0].function.name", ()),
    ("long name", {"tools": [fn("x" * 65)]}, "tools[0].function.name", ()),
    ("array params", {"tools": [fn(parameters={"type": "array"})]}, "tools[0].function.parameters.type", ("object",)),
    (
        "unknown type",
        {"tools": [fn(parameters={"type": "object", "properties": {"a": {"type": "strng"}}})]},
        "tools[0].function.parameters.properties.a.type",
        ("strng",),
    ),
    (
        "bad ref",
        {"tools": [fn(parameters={"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}})]},
        "tools[0].function.parameters.properties.a.$ref",
        ("resolve",),
    ),
    (
        "remote ref",
        {"tools": [fn(parameters={"type": "object", "properties": {"a": {"$ref": "https://example.com/s.json"}}})]},
        "tools[0].function.parameters.properties.a.$ref",
        ("local",),
    ),
    (
        "strict unsupported",
        {
            "tools": [
                fn(
                    strict=True,
                    parameters={"type": "object", "properties": {"a": {"type": "integer", "multipleOf": 3}}},
                )
            ]
        },
        "tools[0].function.parameters.properties.a.multipleOf",
        ("strict",),
    ),
    ("non-bool strict", {"tools": [fn(strict="yes")]}, "tools[0].function.strict", ()),
    ("too many", {"tools": [fn(f"t{i}") for i in range(129)]}, "tools", ("128",)),
    (
        "unknown named",
        {"tools": [fn()], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
        "tool_choice",
        ("nope",),
    ),
    ("required no tools", {"tool_choice": "required"}, "tool_choice", ("required",)),
    (
        "too deep",
        {"tools": [fn(parameters=nest(MAX_DEPTH + 2))]},
        "tools[0].function.parameters" + ".properties.x" * (MAX_DEPTH + 1),
        ("deep",),
    ),
    (
        "huge count",
        {
            "tools": [
                fn(parameters={"type": "object", "properties": {"a": {"type": "array", "maxItems": MAX_COUNT + 1}}})
            ]
        },
        "tools[0].function.parameters.properties.a.maxItems",
        (str(MAX_COUNT),),
    ),
    (
        "too big",
        {
            "tools": [
                fn(
                    parameters={
                        "type": "object",
                        "properties": {f"p{i}": {"type": "string", "description": "x" * 400} for i in range(100)},
                    }
                )
            ]
        },
        "tools[0].function.parameters",
        (str(MAX_SCHEMA_BYTES),),
    ),
    (
        "lookaround",
        {"tools": [fn(parameters={"type": "object", "properties": {"a": {"type": "string", "pattern": "(?=a)b"}}})]},
        "tools[0].function.parameters.properties.a.pattern",
        ("lookaround",),
    ),
    (
        "bad regex",
        {"tools": [fn(parameters={"type": "object", "properties": {"a": {"type": "string", "pattern": "(("}}})]},
        "tools[0].function.parameters.properties.a.pattern",
        ("compile",),
    ),
]

BAD_FORMATS: list[tuple[str, dict[str, Any], str, tuple[str, ...]]] = [
    (
        "no name",
        {"response_format": {"type": "json_schema", "json_schema": {"schema": OBJ}}},
        "response_format.json_schema.name",
        (),
    ),
    (
        "no schema",
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
        "response_format.json_schema.schema",
        (),
    ),
    ("non-bool strict", {"response_format": fmt(strict="true")}, "response_format.json_schema.strict", ()),
    ("schema not object", {"response_format": fmt(schema=[1])}, "response_format.json_schema.schema", ()),
    (
        "strict unknown keyword",
        {"response_format": fmt(schema={"type": "object", "minProperties": 1}, strict=True)},
        "response_format.json_schema.schema.minProperties",
        ("strict",),
    ),
    (
        "strict unknown format",
        {"response_format": fmt(schema={"type": "string", "format": "zip-code"}, strict=True)},
        "response_format.json_schema.schema.format",
        ("zip-code",),
    ),
    ("empty enum", {"response_format": fmt(schema={"enum": []})}, "response_format.json_schema.schema.enum", ()),
    (
        "crossed bounds",
        {"response_format": fmt(schema={"type": "integer", "minimum": 5, "maximum": 1})},
        "response_format.json_schema.schema",
        ("bound",),
    ),
]


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [case[1:] for case in BAD_TOOLS + BAD_FORMATS],
    ids=[case[0] for case in BAD_TOOLS + BAD_FORMATS],
)
def test_bad_input_is_a_400_naming_the_field(
    client: TestClient,
    engine: ScriptedEngine,
    body: dict[str, Any],
    param: str,
    words: tuple[str, ...],
) -> None:
    assert_400(post(client, **body), param, *words)
    assert engine.requests == []  # refused before the engine saw it


def test_bad_input_is_a_400_when_streaming_too(client: TestClient) -> None:
    resp = post(client, stream=True, tools=[fn(), fn()])
    assert_400(resp, "tools[1].function.name")


def test_non_strict_schema_may_carry_unenforced_keywords(client: TestClient, engine: ScriptedEngine) -> None:
    schema = {"type": "object", "minProperties": 1, "properties": {"a": {"format": "zip"}}}
    resp = post(client, response_format=fmt(schema=schema, strict=False), tools=[fn(parameters=schema)])
    assert resp.status_code == 200, resp.text
    request = engine.requests[0]
    assert request.output_format.strict is False
    assert request.tools[0].parameters == schema


def test_valid_tools_reach_the_engine_intact(client: TestClient, engine: ScriptedEngine) -> None:
    schema = {
        "type": "object",
        "$defs": {"unit": {"enum": ["C", "F"]}},
        "properties": {"city": {"type": "string"}, "unit": {"$ref": "#/$defs/unit"}},
        "required": ["city"],
        "additionalProperties": False,
    }
    resp = post(
        client,
        tools=[fn(parameters=schema, strict=True)],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        parallel_tool_calls=False,
    )
    assert resp.status_code == 200, resp.text
    request = engine.requests[0]
    assert request.tools[0].parameters == schema and request.tools[0].strict
    assert (request.tool_choice.mode, request.tool_choice.name) == ("named", "get_weather")
    assert request.parallel_tool_calls is False
