"""The Chat Completions contract over HTTP, against the scripted engine."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from kimi_server.engines.scripted import Script, ScriptedEngine
from kimi_server.engines.types import GenerationRequest
from kimi_server.errors import InvalidRequestError

URL = "/v1/chat/completions"


def body(**kw: Any) -> dict[str, Any]:
    return {"model": "kimi-k3.1-pro", "messages": [{"role": "user", "content": "Hi"}], **kw}


def assert_error(resp: Any, status: int, param: str | None = None) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) >= {"message", "type", "code"}
    assert err["message"]
    if param is not None:
        assert err["param"] == param
        assert param.split("[")[0].split(".")[0] in err["message"] or param in err["message"]
    return dict(err)


def sse_events(text: str) -> list[Any]:
    frames = [f for f in text.split("\n\n") if f.strip()]
    out: list[Any] = []
    for frame in frames:
        assert frame.startswith("data: "), frame
        payload = frame.removeprefix("data: ")
        out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def test_completion_shape_and_usage(client: TestClient) -> None:
    data = client.post(URL, json=body()).json()
    assert data["object"] == "chat.completion"
    assert data["id"].startswith("chatcmpl-")
    assert data["model"] == "kimi-k3.1-pro"
    choice = data["choices"][0]
    assert choice["index"] == 0 and choice["finish_reason"] == "stop"
    assert choice["message"] == {
        "role": "assistant",
        "content": "Hello there.",
        "reasoning_content": "Let me think.",
    }
    usage = data["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage["completion_tokens_details"]["reasoning_tokens"] == 2
    assert usage["prompt_tokens_details"] == {"cached_tokens": 0, "cache_write_tokens": 12}


def test_auth_required_except_health(client: TestClient) -> None:
    anon = {"Authorization": ""}
    assert_error(client.post(URL, json=body(), headers=anon), 401)
    assert_error(client.post(URL, json=body(), headers={"Authorization": "Bearer nope"}), 401)
    assert_error(client.get("/v1/models", headers=anon), 401)
    assert_error(client.get("/openapi.json", headers=anon), 401)
    assert client.get("/health", headers=anon).json() == {"status": "ok"}


def test_openapi_documents_the_endpoint(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    assert "/v1/chat/completions" in schema["paths"]
    assert "ChatCompletionRequest" in schema["components"]["schemas"]


def test_models_list(client: TestClient) -> None:
    data = client.get("/v1/models").json()
    assert data["object"] == "list"
    assert [m["id"] for m in data["data"]] == ["kimi-k3.1-pro", "kimi-k3.1-pro-highspeed", "kimi-k3"]
    assert client.get("/v1/models/kimi-k3").json()["id"] == "kimi-k3"
    assert_error(client.get("/v1/models/gpt-4"), 404)


def test_unknown_model_is_404(client: TestClient) -> None:
    assert_error(client.post(URL, json=body(model="gpt-4")), 404, "model")


@pytest.mark.parametrize(
    ("model", "effort", "level"),
    [
        ("kimi-k3.1-pro", None, "max"),
        ("kimi-k3.1-pro", "low", "low"),
        ("kimi-k3.1-pro", "medium", "high"),
        ("kimi-k3.1-pro", "xhigh", "max"),
        ("kimi-k3.1-pro-highspeed", "minimal", "low"),
        ("kimi-k3.1-pro-highspeed", "none", "low"),
        ("kimi-k3", None, "max"),
        ("kimi-k3", "max", "max"),
    ],
)
def test_effort_levels_and_aliases(
    client: TestClient, engine: ScriptedEngine, model: str, effort: str | None, level: str
) -> None:
    extra = {"reasoning_effort": effort} if effort else {}
    assert client.post(URL, json=body(model=model, **extra)).status_code == 200
    request = engine.requests[-1]
    assert request.effort == level
    assert request.budget.cap > 0


def test_effort_budgets_grow_with_level(client: TestClient, engine: ScriptedEngine) -> None:
    caps = []
    for effort in ("low", "high", "max"):
        client.post(URL, json=body(reasoning_effort=effort))
        caps.append(engine.requests[-1].budget)
    assert caps[0].cap < caps[1].cap < caps[2].cap
    assert caps[0].floor < caps[1].floor < caps[2].floor


@pytest.mark.parametrize("effort", ["low", "high", "medium", "none"])
def test_k3_accepts_only_max(client: TestClient, effort: str) -> None:
    assert_error(client.post(URL, json=body(model="kimi-k3", reasoning_effort=effort)), 400, "reasoning_effort")


def test_unknown_effort_is_400(client: TestClient) -> None:
    assert_error(client.post(URL, json=body(reasoning_effort="extreme")), 400, "reasoning_effort")


def test_sampling_rules(client: TestClient) -> None:
    assert_error(client.post(URL, json=body(model="kimi-k3", temperature=0.5)), 400, "temperature")
    assert_error(client.post(URL, json=body(model="kimi-k3", top_p=0.5)), 400, "top_p")
    assert client.post(URL, json=body(model="kimi-k3", temperature=1, top_p=0.95)).status_code == 200
    ok = client.post(URL, json=body(temperature=0.5, top_p=0.1))
    assert ok.status_code == 200
    assert_error(client.post(URL, json=body(temperature="hot")), 400, "temperature")


def test_cache_options_rules(client: TestClient, engine: ScriptedEngine) -> None:
    assert_error(
        client.post(URL, json=body(model="kimi-k3", prompt_cache_options={"ttl": "5m"})),
        400,
        "prompt_cache_options",
    )
    client.post(URL, json=body(prompt_cache_options={"mode": "implicit", "ttl": "1h"}))
    assert engine.requests[-1].cache.ttl_seconds == 3600
    client.post(URL, json=body())
    assert engine.requests[-1].cache.ttl_seconds == 300
    assert_error(client.post(URL, json=body(prompt_cache_options={"ttl": "2h"})), 400, "prompt_cache_options.ttl")


def test_kimi_k3_bills_writes_as_input(client: TestClient) -> None:
    usage = client.post(URL, json=body(model="kimi-k3")).json()["usage"]
    assert usage["prompt_tokens_details"]["cache_write_tokens"] == 0


def test_max_tokens_rules(client: TestClient, engine: ScriptedEngine) -> None:
    client.post(URL, json=body())
    assert engine.requests[-1].max_output_tokens == 131072
    client.post(URL, json=body(max_tokens=77))
    assert engine.requests[-1].max_output_tokens == 77
    client.post(URL, json=body(max_completion_tokens=1048576))
    assert engine.requests[-1].max_output_tokens == 1048576
    assert_error(client.post(URL, json=body(max_completion_tokens=1048577)), 400, "max_completion_tokens")
    assert_error(client.post(URL, json=body(max_completion_tokens=0)), 400, "max_completion_tokens")
    # Both set: served, max_completion_tokens wins.
    assert client.post(URL, json=body(max_completion_tokens=5, max_tokens=900)).status_code == 200
    assert engine.requests[-1].max_output_tokens == 5


def test_length_finish_when_cap_hit(client: TestClient) -> None:
    data = client.post(URL, json=body(max_completion_tokens=3)).json()
    assert data["choices"][0]["finish_reason"] == "length"
    assert data["usage"]["completion_tokens"] == 3


def test_message_rules(client: TestClient) -> None:
    tool_msg = {"role": "tool", "content": "42"}
    err = assert_error(client.post(URL, json=body(messages=[tool_msg])), 400)
    assert "tool_call_id" in err["message"] and err["param"] == "messages[0]"
    assert_error(client.post(URL, json=body(messages=[])), 400, "messages")
    assert_error(client.post(URL, json=body(messages=[{"role": "wizard", "content": "x"}])), 400, "messages[0].role")
    assert_error(client.post(URL, json=body(messages=[{"role": "user"}])), 400, "messages[0]")
    bad_part = [{"role": "user", "content": [{"type": "text"}]}]
    assert_error(client.post(URL, json=body(messages=bad_part)), 400, "messages[0].content[0].text")


def test_history_with_reasoning_and_tool_calls(client: TestClient, engine: ScriptedEngine) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "I should call the tool.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    assert client.post(URL, json=body(messages=messages, tools=tools)).status_code == 200
    req: GenerationRequest = engine.requests[-1]
    assistant = req.messages[2]
    assert assistant.reasoning == "I should call the tool."
    assert assistant.tool_calls[0].name == "get_weather"
    assert req.messages[3].tool_call_id == "call_1"


def test_images_refused_by_text_model(client: TestClient) -> None:
    content = [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
    ]
    err = assert_error(client.post(URL, json=body(messages=[{"role": "user", "content": content}])), 400)
    assert err["param"] == "messages[0].content[1]" and "image" in err["message"]


def test_unknown_builtin_function_refused(client: TestClient) -> None:
    # Web search itself is tested in test_web_search_schema.py.
    tool = {"type": "builtin_function", "function": {"name": "$browse"}}
    assert_error(client.post(URL, json=body(tools=[tool])), 400, "tools[0].function.name")


def test_malformed_bodies(client: TestClient) -> None:
    headers = {"content-type": "application/json"}
    err = assert_error(client.post(URL, content=b"{not json", headers=headers), 400)
    assert "JSON" in err["message"]
    assert_error(client.post(URL, content=b"[1, 2]", headers=headers), 400)
    assert_error(client.post(URL, json={"messages": [{"role": "user", "content": "x"}]}), 400, "model")
    assert_error(client.post(URL, json=body(stream="yes")), 400, "stream")
    assert_error(client.post(URL, json=body(n=2)), 400, "n")


def test_body_over_limit_is_413(client: TestClient) -> None:
    huge = "x" * (9 * 1024 * 1024)
    assert_error(client.post(URL, json=body(messages=[{"role": "user", "content": huge}])), 413)


def test_unknown_route_uses_error_shape(client: TestClient) -> None:
    assert_error(client.get("/v1/nothing"), 404)


def test_stream_order_usage_and_done(client: TestClient) -> None:
    resp = client.post(URL, json=body(stream=True, stream_options={"include_usage": True}))
    assert resp.headers["content-type"].startswith("text/event-stream")
    events = sse_events(resp.text)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    kinds = []
    for chunk in chunks[:-1]:
        assert chunk["object"] == "chat.completion.chunk" and chunk["usage"] is None
        delta = chunk["choices"][0]["delta"]
        kinds += [k for k in ("reasoning_content", "content") if k in delta]
    assert kinds == ["reasoning_content", "reasoning_content", "content", "content"]
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    final = chunks[-1]
    assert final["choices"] == [] and final["usage"]["completion_tokens"] == 4


def test_stream_without_usage_option(client: TestClient) -> None:
    events = sse_events(client.post(URL, json=body(stream=True)).text)
    assert all("usage" not in e for e in events[:-1])


def test_failure_mid_stream_ends_with_error_then_done(client: TestClient, engine: ScriptedEngine) -> None:
    engine.script = Script(fail_after=3)
    events = sse_events(client.post(URL, json=body(stream=True)).text)
    assert events[-1] == "[DONE]"
    error = events[-2]["error"]
    assert error["type"] == "server_error"
    assert "scripted" not in error["message"] and "Traceback" not in error["message"]


def test_failure_before_first_byte_is_http_error(client: TestClient, engine: ScriptedEngine) -> None:
    def refuse(_: GenerationRequest) -> None:
        raise InvalidRequestError("The prompt is too long.", param="messages", code="context_length_exceeded")

    engine.on_generate = refuse
    err = assert_error(client.post(URL, json=body(stream=True)), 400)
    assert err["code"] == "context_length_exceeded"


def test_internal_error_hides_details(client: TestClient, engine: ScriptedEngine) -> None:
    engine.script = Script(fail_after=1)
    err = assert_error(client.post(URL, json=body()), 500)
    assert "scripted" not in err["message"]
