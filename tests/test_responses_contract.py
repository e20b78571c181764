"""Responses contract tests over the scripted engine: shapes, rules, errors, statelessness,
reasoning round-trips and sealing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from kimi_server.engines.scripted import Script, ScriptedEngine
from kimi_server.engines.types import ToolCallDelta
from kimi_server.http.responses_router import responses_sse
from kimi_server.policy.catalogue import CATALOGUE
from kimi_server.protocol.responses import ResponsesRequest
from kimi_server.serving import responses
from kimi_server.serving.primed import prime
from kimi_server.serving.responses_request import build_responses_request
from kimi_server.serving.sealing import Sealer, load_or_create_key
from kimi_server.settings import Settings
from tests.conftest import OTHER_KEY, ScriptedApp
from tests.media_samples import data_url
from tests.media_samples import image as png_image
from tests.responses_util import body, parse_sse, weather_tool

REASONING = ("The user greets me. ", "A short hello fits. ", "Nothing else is needed.")


def post(client: TestClient, **fields: Any) -> dict[str, Any]:
    r = client.post("/v1/responses", json=body(**fields))
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    return data


def error(client: TestClient, status: int = 400, **fields: Any) -> dict[str, Any]:
    r = client.post("/v1/responses", json=body(**fields))
    assert r.status_code == status, r.text
    err: dict[str, Any] = r.json()["error"]
    assert set(err) >= {"message", "type", "code"}
    return err


# --- shape and echo -----------------------------------------------------------------------------


def test_plain_response_shape_and_stateless_fields(client: TestClient, engine: ScriptedEngine) -> None:
    engine.script = Script(reasoning=REASONING)
    r = post(client)
    assert r["object"] == "response" and r["id"].startswith("resp_")
    assert r["status"] == "completed" and r["completed_at"] >= r["created_at"]
    assert (r["store"], r["background"], r["previous_response_id"], r["conversation"]) == (
        False,
        False,
        None,
        None,
    )
    assert [o["type"] for o in r["output"]] == ["reasoning", "message"]
    reasoning, message = r["output"]
    assert reasoning["encrypted_content"] and reasoning["status"] == "completed"
    assert reasoning["summary"] == [
        {
            "type": "summary_text",
            "text": "The user greets me. A short hello fits. Nothing else is needed.",
        }
    ]
    assert message["content"][0] == {
        "type": "output_text",
        "text": "Hello there.",
        "annotations": [],
        "logprobs": [],
    }
    assert r["error"] is None and r["incomplete_details"] is None


def test_usage_follows_chat_accounting(client: TestClient, engine: ScriptedEngine) -> None:
    engine.script = Script(reasoning=REASONING, prompt_tokens=40, cached_tokens=30)
    usage = post(client)["usage"]
    assert usage == {
        "input_tokens": 40,
        "input_tokens_details": {"cached_tokens": 30, "cache_write_tokens": 10},
        "output_tokens": 5,
        "output_tokens_details": {"reasoning_tokens": 3},
        "total_tokens": 45,
    }
    chat = client.post(
        "/v1/chat/completions",
        json={"model": "kimi-k3.1-pro", "messages": [{"role": "user", "content": "hi"}]},
    ).json()["usage"]
    assert chat["prompt_tokens_details"]["cache_write_tokens"] == 10
    k3 = post(client, model="kimi-k3", reasoning=None)["usage"]["input_tokens_details"]
    assert k3 == {"cached_tokens": 30, "cache_write_tokens": 0}  # kimi-k3 bills writes as input


def test_settings_are_echoed_as_applied(client: TestClient, engine: ScriptedEngine) -> None:
    tool = weather_tool()
    r = post(
        client,
        instructions="Be brief.",
        reasoning={"effort": "medium", "summary": "detailed"},
        temperature=0.3,
        top_p=0.5,
        max_output_tokens=500,
        tools=[tool],
        tool_choice="required",
        parallel_tool_calls=False,
        prompt_cache_options={"ttl": "1h"},
        metadata={"run": "7"},
    )
    assert r["instructions"] == "Be brief."
    assert r["reasoning"] == {"effort": "medium", "summary": "detailed"}
    assert (r["temperature"], r["top_p"]) == (1.0, 0.95)  # K3.1 ignores both
    assert r["max_output_tokens"] == 500
    assert r["tools"] == [{**tool, "strict": True}]
    assert r["tool_choice"] == "required" and r["parallel_tool_calls"] is False
    assert r["prompt_cache_options"] == {"mode": "implicit", "ttl": "1h"}
    assert r["metadata"] == {"run": "7"}
    gen = engine.requests[-1]
    assert gen.effort == "high" and gen.max_output_tokens == 500
    assert gen.cache.ttl_seconds == 3600 and gen.parallel_tool_calls is False
    assert gen.messages[0].role == "system" and gen.messages[0].text == "Be brief."


def test_defaults_when_omitted(client: TestClient, engine: ScriptedEngine) -> None:
    r = post(client, reasoning=None)
    assert r["prompt_cache_options"] == {"mode": "implicit", "ttl": "5m"}
    assert r["max_output_tokens"] == 131072 and r["text"] == {"format": {"type": "text"}}
    assert engine.requests[-1].effort == "max"


# --- the shared contract rules ------------------------------------------------------------------


def test_effort_rules_match_chat(client: TestClient) -> None:
    err = error(client, model="kimi-k3", reasoning={"effort": "low"})
    assert err["param"] == "reasoning.effort" and err["code"] == "unsupported_value"
    assert error(client, reasoning={"effort": "huge"})["param"] == "reasoning.effort"


def test_sampling_fixed_on_kimi_k3(client: TestClient) -> None:
    assert error(client, model="kimi-k3", reasoning=None, temperature=0.5)["param"] == "temperature"
    post(client, model="kimi-k3", reasoning=None, temperature=1.0, top_p=0.95)


def test_structured_output_and_cache_options_only_on_k31(client: TestClient, engine: ScriptedEngine) -> None:
    fmt = {"type": "json_schema", "name": "greeting", "schema": {"type": "object"}}
    err = error(client, model="kimi-k3", reasoning=None, text={"format": fmt})
    assert err["param"] == "text.format"
    assert error(client, model="kimi-k3", reasoning=None, text={"format": {"type": "json_object"}})
    err = error(client, model="kimi-k3", reasoning=None, prompt_cache_options={"ttl": "1h"})
    assert err["param"] == "prompt_cache_options"
    r = post(client, text={"format": fmt})
    assert r["text"]["format"] == {**fmt, "description": None, "strict": True}
    out = engine.requests[-1].output_format
    assert (out.kind, out.name, out.schema) == ("json_schema", "greeting", {"type": "object"})


def test_unknown_model_is_404(client: TestClient) -> None:
    assert error(client, 404, model="gpt-4o")["param"] == "model"


def test_max_output_tokens_range(client: TestClient) -> None:
    assert error(client, max_output_tokens=0)["param"] == "max_output_tokens"
    assert error(client, max_output_tokens=1_048_577)["param"] == "max_output_tokens"


# --- statelessness ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [("previous_response_id", "resp_123"), ("background", True), ("conversation", "conv_1")],
)
def test_stateful_requests_are_refused_with_advice(client: TestClient, field: str, value: Any) -> None:
    err = error(client, **{field: value})
    assert err["param"] == field and "'input'" in err["message"]


def test_item_reference_is_refused(client: TestClient) -> None:
    err = error(client, input=[{"type": "item_reference", "id": "msg_1"}])
    assert err["param"] == "input[0].type" and "stateless" in err["message"]


def test_store_true_is_answered_with_store_false(client: TestClient) -> None:
    assert post(client, store=True)["store"] is False


# --- bad input names the field ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"input": [{"type": "shell_call", "id": "x"}]}, "input[0].type"),
        (
            {"input": [{"role": "user", "content": [{"type": "output_text", "text": "x"}]}]},
            "input[0].content[0].type",
        ),
        (
            {"input": [{"role": "assistant", "content": [{"type": "input_text", "text": "x"}]}]},
            "input[0].content[0].type",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_video", "url": "x"}]}]},
            "input[0].content[0]",
        ),
        ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
        ({"input": ["hello"]}, "input[0]"),
        ({"input": []}, "input"),
        (
            {
                "input": [
                    {"role": "user", "content": "x"},
                    {"type": "function_call_output", "output": "sunny"},
                ]
            },
            "input[1].call_id",
        ),
        (
            {"input": [{"type": "function_call", "call_id": "c1", "arguments": "{}"}]},
            "input[0].name",
        ),
        ({"tools": [{"type": "file_search"}]}, "tools[0]"),
        ({"tools": [{"type": "custom", "name": "run_shell"}]}, "tools[0].name"),
        ({"tools": [weather_tool(), weather_tool()]}, "tools[1].name"),
        (
            {
                "tools": [
                    {
                        "type": "namespace",
                        "name": "ns",
                        "tools": [{"type": "custom", "name": "apply_patch"}],
                    }
                ]
            },
            "tools[0].tools[0].type",
        ),
        (
            {"tools": [{"type": "namespace", "name": "n" * 40, "tools": [weather_tool("f" * 30)]}]},
            "tools[0].tools[0].name",
        ),
        ({"tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
        ({"include": ["message.output_text.logprobs"]}, "include[0]"),
        ({"text": {"format": {"type": "xml"}}}, "text.format"),
    ],
)
def test_bad_input_is_400_naming_the_field(client: TestClient, fields: dict[str, Any], param: str) -> None:
    err = error(client, **fields)
    assert err["param"] == param, err
    assert err["type"] == "invalid_request_error"


def test_images_are_refused_by_a_model_that_cannot_see(client: TestClient) -> None:
    image = {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}
    content = [{"type": "input_text", "text": "What is this?"}, image]
    err = error(client, input=[{"role": "user", "content": content}])
    assert err["param"] == "input[0].content[1]" and "cannot see" in err["message"]


def test_images_reach_a_model_that_can_see(client: TestClient, engine: ScriptedEngine) -> None:
    engine.images = True
    url = data_url("image/png", png_image("PNG"))  # checked first: a real PNG
    image = {"type": "input_image", "image_url": url}
    post(client, input=[{"role": "user", "content": [{"type": "input_text", "text": "?"}, image]}])
    assert engine.requests[-1].messages[0].images == (url,)


# --- multi-turn input ---------------------------------------------------------------------------


def test_items_become_one_conversation(client: TestClient, engine: ScriptedEngine) -> None:
    post(
        client,
        instructions="Top.",
        tools=[weather_tool()],
        input=[
            {"type": "message", "role": "developer", "content": "Dev."},
            {"role": "user", "content": [{"type": "input_text", "text": "Weather in Oslo?"}]},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Checking."}],
            },
            {
                "type": "function_call",
                "call_id": "c1",
                "name": "get_weather",
                "arguments": '{"city":"Oslo"}',
            },
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        ],
    )
    msgs = engine.requests[-1].messages
    assert [m.role for m in msgs] == ["system", "system", "user", "assistant", "tool"]
    assert msgs[0].text == "Top." and msgs[1].text == "Dev."
    assert msgs[3].text == "Checking." and msgs[3].tool_calls[0].name == "get_weather"
    assert msgs[4].tool_call_id == "c1" and msgs[4].text == "sunny"


# --- reasoning round-trip and sealing -----------------------------------------------------------


def _first_turn(client: TestClient, engine: ScriptedEngine) -> dict[str, Any]:
    engine.script = Script(reasoning=REASONING)
    return post(client, input="Hi!")


def test_reasoning_item_restores_the_reasoning(client: TestClient, engine: ScriptedEngine) -> None:
    first = _first_turn(client, engine)
    post(
        client,
        input=[
            {"role": "user", "content": "Hi!"},
            *first["output"],
            {"role": "user", "content": "Again."},
        ],
    )
    msgs = engine.requests[-1].messages
    assert [m.role for m in msgs] == ["user", "assistant", "user"]
    assert msgs[1].reasoning == "".join(REASONING)  # the full reasoning, not the summary
    assert msgs[1].text == "Hello there."


def _tampered(blob: str) -> str:
    i = len(blob) // 2
    return blob[:i] + ("A" if blob[i] != "A" else "B") + blob[i + 1 :]


@pytest.mark.parametrize("mangle", [_tampered, lambda b: b[:-4], lambda b: "not base64!", lambda b: ""])
def test_altered_reasoning_is_400(client: TestClient, engine: ScriptedEngine, mangle: Any) -> None:
    reasoning = _first_turn(client, engine)["output"][0]
    bad = {**reasoning, "encrypted_content": mangle(reasoning["encrypted_content"])}
    err = error(client, input=[{"role": "user", "content": "Hi!"}, bad])
    assert err["param"] == "input[1].encrypted_content"
    assert err["code"] == "invalid_encrypted_content"


def test_reasoning_from_another_key_or_server_is_400(
    client: TestClient, engine: ScriptedEngine, scripted_app: ScriptedApp, tmp_path: Path
) -> None:
    reasoning = _first_turn(client, engine)["output"][0]
    items = [reasoning, {"role": "user", "content": "Again."}]
    r = client.post("/v1/responses", json=body(input=items), headers={"Authorization": f"Bearer {OTHER_KEY}"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input[0].encrypted_content"
    with scripted_app(engine, data_dir=tmp_path / "elsewhere") as c:
        r = c.post("/v1/responses", json=body(input=items))
    assert r.status_code == 400 and r.json()["error"]["param"] == "input[0].encrypted_content"


def test_reasoning_without_encrypted_content_is_400(client: TestClient) -> None:
    item = {"type": "reasoning", "id": "rs_1", "summary": []}
    assert error(client, input=[item])["param"] == "input[0].encrypted_content"


# --- incomplete and failed ----------------------------------------------------------------------


def test_output_cap_gives_incomplete(client: TestClient, engine: ScriptedEngine) -> None:
    engine.script = Script(reasoning=("Hm.",), content=("a", "b", "c"))
    r = post(client, max_output_tokens=2)
    assert r["status"] == "incomplete"
    assert r["incomplete_details"] == {"reason": "max_output_tokens"}
    assert r["output"][-1]["status"] == "incomplete" and r["output"][-1]["content"][0]["text"] == "a"


def test_failure_after_start_is_a_failed_response_without_internals(client: TestClient, engine: ScriptedEngine) -> None:
    engine.script = Script(fail_after=3)
    r = post(client)
    assert r["status"] == "failed" and r["completed_at"] is None
    assert r["error"]["code"] == "server_error" and "scripted" not in r["error"]["message"]
    events = parse_sse(client.post("/v1/responses", json=body(stream=True)).text)
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["error"] == r["error"]


def test_failure_before_output_is_an_http_error(client: TestClient, engine: ScriptedEngine) -> None:
    engine.script = Script(fail_after=0)
    quiet = TestClient(client.app, headers=dict(client.headers), raise_server_exceptions=False)
    for stream in (False, True):
        err = error(quiet, 500, stream=stream)
        assert err["type"] == "server_error" and "scripted" not in err["message"]


# --- tool calls ---------------------------------------------------------------------------------


def _calls(*deltas: ToolCallDelta) -> Script:
    return Script(reasoning=REASONING, content=(), tool_calls=deltas)


def test_function_calls_become_output_items(client: TestClient, engine: ScriptedEngine) -> None:
    engine.script = _calls(
        ToolCallDelta(0, "call_a", "get_weather", '{"city":'),
        ToolCallDelta(0, None, None, '"Oslo"}'),
        ToolCallDelta(1, "call_b", "get_weather", '{"city":"Rome"}'),
    )
    r = post(client, tools=[weather_tool()])
    assert [o["type"] for o in r["output"]] == ["reasoning", "function_call", "function_call"]
    first, second = r["output"][1:]
    assert (first["call_id"], first["name"], first["arguments"]) == (
        "call_a",
        "get_weather",
        '{"city":"Oslo"}',
    )
    assert second["call_id"] == "call_b" and first["status"] == "completed"
    assert r["status"] == "completed"


def test_namespace_tools_are_flattened_and_split_back(client: TestClient, engine: ScriptedEngine) -> None:
    ns = {
        "type": "namespace",
        "name": "weather",
        "description": "Weather tools.",
        "tools": [weather_tool("current")],
    }
    engine.script = _calls(ToolCallDelta(0, "call_a", "weather__current", '{"city":"Oslo"}'))
    r = post(client, tools=[ns])
    assert [t.name for t in engine.requests[-1].tools] == ["weather__current"]
    call = r["output"][1]
    assert (call["name"], call["namespace"]) == ("current", "weather")
    assert r["tools"][0]["tools"][0]["name"] == "current"
    post(
        client,
        tools=[ns],
        input=[
            {"role": "user", "content": "Oslo?"},
            {
                "type": "function_call",
                "call_id": "c1",
                "name": "current",
                "namespace": "weather",
                "arguments": "{}",
            },
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        ],
    )
    assert engine.requests[-1].messages[1].tool_calls[0].name == "weather__current"


def test_custom_apply_patch_tool(client: TestClient, engine: ScriptedEngine) -> None:
    tool = {"type": "custom", "name": "apply_patch", "description": "Edit files."}
    engine.script = _calls(ToolCallDelta(0, "call_p", "apply_patch", "*** Begin Patch", "custom"))
    r = post(client, tools=[tool])
    assert engine.requests[-1].tools[0].kind == "custom"
    call = r["output"][1]
    assert call["type"] == "custom_tool_call" and call["input"] == "*** Begin Patch"
    events = parse_sse(client.post("/v1/responses", json=body(tools=[tool], stream=True)).text)
    kinds = [e["type"] for e in events]
    assert "response.custom_tool_call_input.delta" in kinds
    assert "response.custom_tool_call_input.done" in kinds
    post(
        client,
        tools=[tool],
        input=[
            {"role": "user", "content": "Patch it."},
            {"type": "custom_tool_call", "call_id": "call_p", "name": "apply_patch", "input": "x"},
            {"type": "custom_tool_call_output", "call_id": "call_p", "output": "done"},
        ],
    )
    assert engine.requests[-1].messages[1].tool_calls[0].kind == "custom"


def test_tool_choice_none_hides_tools_and_allowed_tools_filters(client: TestClient, engine: ScriptedEngine) -> None:
    tools = [weather_tool(), weather_tool("get_time")]
    post(client, tools=tools, tool_choice="none")
    hidden = engine.requests[-1]
    assert hidden.tools == ()
    choice = {
        "type": "allowed_tools",
        "mode": "required",
        "tools": [{"type": "function", "name": "get_time"}],
    }
    r = post(client, tools=tools, tool_choice=choice)
    assert [t.name for t in engine.requests[-1].tools] == ["get_time"]
    assert engine.requests[-1].tool_choice.mode == "required"
    assert r["tool_choice"] == choice and len(r["tools"]) == 2


def test_each_event_is_one_whole_write() -> None:
    """StreamingResponse sends each chunk the framer yields as one body message."""

    async def events() -> Any:
        for n, kind in enumerate(("response.created", "response.output_text.delta")):
            yield {"type": kind, "sequence_number": n, "delta": "a\nb"}

    async def collect() -> list[bytes]:
        return [chunk async for chunk in responses_sse(events())]

    chunks = asyncio.run(collect())
    assert len(chunks) == 2
    for chunk in chunks:
        assert parse_sse(chunk.decode()) and chunk.endswith(b"\n\n") and chunk.count(b"\n\n") == 1


def test_closing_the_stream_cancels_the_generation(engine: ScriptedEngine, tmp_path: Path) -> None:
    """What a departed client does to the event stream reaches the engine."""
    sealer = Sealer(load_or_create_key(tmp_path / "key"))
    plan = build_responses_request(
        ResponsesRequest.model_validate(body()),
        served=frozenset(s.id for s in CATALOGUE),
        budgets=Settings().budgets,
        key_id="k",
        accepts_images=False,
        sealer=sealer,
    )

    async def scenario() -> tuple[str, int]:
        events = await prime(engine.generate(plan.gen))
        stream = responses.stream(plan, sealer, events)
        assert isinstance(stream, AsyncGenerator)  # closable, as the server closes it
        seen = [await anext(stream) for _ in range(5)]
        await stream.aclose()
        return seen[-1]["type"], engine.cancelled  # counted now, not at loop shutdown

    last, cancelled = asyncio.run(scenario())
    assert last == "response.reasoning_summary_text.delta" and cancelled == 1
