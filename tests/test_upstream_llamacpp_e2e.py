"""End to end against a real upstream this project did not write: llama.cpp's own HTTP server
(OpenAI-compatible), with kimi-server in front (`serve --upstream`), through the openai SDK."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionFunctionToolParam, ChatCompletionMessageParam
from openai.types.responses import ResponseCompletedEvent, ResponseIncompleteEvent

from tests.conftest import LiveServer, start_server, stop_server
from tests.upstreams.fixtures import llamacpp_server

pytestmark = pytest.mark.e2e

PROMPT: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hello."}]
MORE_TURNS: list[ChatCompletionMessageParam] = [
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Now in French, s'il te plaît: « bonjour » 🙂"},
]
WEATHER: ChatCompletionFunctionToolParam = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
SCHEMA = {
    "type": "object",
    # Bounded, so the number's digits fit the small output caps below (unbounded, the tiny
    # model was seen to write 13 digits and be cut off).
    "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9999}},
    "required": ["n"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    tmp = tmp_path_factory.mktemp("upstream-e2e")
    with llamacpp_server(tmp) as upstream:
        # A model name that cannot be loaded: with --upstream the embedded engine never starts.
        proc, server = start_server(
            tmp, "--upstream", upstream, "--upstream-dialect", "llamacpp", "--model", "no-such-model"
        )
        try:
            yield server
        finally:
            stop_server(proc)


def sdk(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key=server.key, max_retries=0, timeout=300)


def test_models_lists_what_the_upstream_serves(front: LiveServer) -> None:
    ids = {m.id for m in sdk(front).models.list()}
    assert ids == {"kimi-k3.1-pro", "kimi-k3.1-pro-highspeed", "kimi-k3"}


def test_chat_plain_and_streamed(front: LiveServer) -> None:
    client = sdk(front)
    resp = client.chat.completions.create(model="kimi-k3.1-pro", messages=PROMPT, max_completion_tokens=8)
    assert resp.model == "kimi-k3.1-pro"
    assert resp.choices[0].message.content
    assert resp.choices[0].finish_reason in ("stop", "length")
    assert resp.usage is not None and resp.usage.prompt_tokens > 0
    assert 0 < resp.usage.completion_tokens <= 8

    stream = client.chat.completions.create(
        model="kimi-k3.1-pro",
        messages=PROMPT,
        max_completion_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert text
    assert finishes in (["stop"], ["length"])
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens <= 8


def test_partial_mode_is_continued_by_llamacpps_own_prefill(front: LiveServer) -> None:
    """The prefix leaves as a final assistant message, which llama.cpp's server continues; the
    client hears only the continuation, streamed or not."""
    prefix = "Hello! My name is"
    messages: list[Any] = [*PROMPT, {"role": "assistant", "content": prefix, "partial": True}]
    client = sdk(front)
    resp = client.chat.completions.create(model="kimi-k3.1-pro", messages=messages, max_completion_tokens=12)
    content = resp.choices[0].message.content or ""
    assert content.strip() and not content.lstrip().startswith(prefix)
    stream = client.chat.completions.create(
        model="kimi-k3.1-pro", messages=messages, max_completion_tokens=12, stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text.strip() and not text.lstrip().startswith(prefix)


def test_catalogue_rules_are_enforced_before_the_request_leaves(front: LiveServer) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        sdk(front).chat.completions.create(model="kimi-k3", messages=PROMPT, temperature=0.3, max_completion_tokens=8)
    assert isinstance(info.value.body, dict) and info.value.body["param"] == "temperature"


def test_chat_with_tools_round_trips(front: LiveServer) -> None:
    resp = sdk(front).chat.completions.create(
        model="kimi-k3.1-pro",
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[WEATHER],
        max_completion_tokens=24,
    )
    choice = resp.choices[0]
    # This llama.cpp build answers tool requests for the tiny model in text; either way the
    # answer has the contract's shape and its finish reason agrees with it.
    if choice.message.tool_calls:
        assert choice.finish_reason == "tool_calls"
        call = choice.message.tool_calls[0]
        assert call.type == "function" and call.function.name == "get_weather"
    else:
        assert choice.finish_reason in ("stop", "length")
        assert choice.message.content


def test_chat_json_schema_plain_and_streamed(front: LiveServer) -> None:
    client = sdk(front)
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "number", "schema": SCHEMA, "strict": True}}
    messages: Any = [{"role": "user", "content": "Give me a number as JSON."}]
    resp = client.chat.completions.create(
        model="kimi-k3.1-pro", messages=messages, response_format=fmt, max_completion_tokens=64
    )
    assert isinstance(json.loads(resp.choices[0].message.content or "")["n"], int)
    stream = client.chat.completions.create(
        model="kimi-k3.1-pro", messages=messages, response_format=fmt, max_completion_tokens=64, stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert isinstance(json.loads(text)["n"], int)


def test_responses_plain_and_streamed_with_schema(front: LiveServer) -> None:
    client = sdk(front)
    resp = client.responses.create(model="kimi-k3.1-pro", input="Say hello.", max_output_tokens=8)
    assert resp.output_text
    assert resp.usage is not None and resp.usage.output_tokens <= 8
    fmt: Any = {"format": {"type": "json_schema", "name": "number", "schema": SCHEMA, "strict": True}}
    events = list(
        client.responses.create(
            model="kimi-k3.1-pro", input="Give me a number as JSON.", text=fmt, max_output_tokens=48, stream=True
        )
    )
    types = [e.type for e in events]
    assert types[0] == "response.created"
    # The tiny model sometimes pads its JSON to the cap: then the stream ends incomplete, and the
    # answer it was cut from is still closed to a value the schema accepts.
    assert types[-1] in {"response.completed", "response.incomplete"}
    assert isinstance(events[-1], ResponseCompletedEvent | ResponseIncompleteEvent)
    final = events[-1].response
    assert isinstance(json.loads(final.output_text)["n"], int)


def test_responses_with_tools(front: LiveServer) -> None:
    tool: Any = {"type": "function", **WEATHER["function"]}
    resp = sdk(front).responses.create(
        model="kimi-k3.1-pro", input="What is the weather in Paris?", tools=[tool], max_output_tokens=24
    )
    kinds = {item.type for item in resp.output}
    assert kinds & {"message", "function_call"}


def test_deep_health_reports_the_upstream(front: LiveServer) -> None:
    root = front.base_url.removesuffix("/v1")
    assert httpx.get(f"{root}/health?deep=1").status_code == 401
    report = httpx.get(f"{root}/health?deep=1", headers={"Authorization": f"Bearer {front.key}"}).json()
    [up] = report["upstreams"]
    assert up["ok"] is True and up["state"] == "closed" and up["dialect"] == "llamacpp"


def test_messages_door_through_the_upstream(front: LiveServer) -> None:
    """The anthropic SDK against kimi-server in front of llama.cpp's server: create, a stream
    rebuilt by the SDK, a forced tool call with its parsed input, errors in Anthropic's shape."""
    client = anthropic.Anthropic(
        base_url=front.base_url.removesuffix("/v1") + "/anthropic", api_key=front.key, max_retries=0, timeout=300
    )
    hello: Any = [{"role": "user", "content": "Say hello."}]
    created = client.messages.create(model="kimi-k3.1-pro", max_tokens=16, messages=hello)
    assert created.content[-1].type == "text" and created.stop_reason in ("end_turn", "max_tokens")
    assert created.usage.input_tokens + (created.usage.cache_read_input_tokens or 0) > 0
    with client.messages.stream(model="kimi-k3.1-pro", max_tokens=16, messages=hello) as stream:
        rebuilt = stream.get_final_message()
    assert rebuilt.content[-1].type == "text" and rebuilt.usage.output_tokens > 0
    # Closed, and one call: left open, the tiny model was seen to add made-up properties until
    # the cap ended the call.
    tool: Any = {
        "name": "get_weather",
        "description": "Weather for a city.",
        "input_schema": {**WEATHER["function"]["parameters"], "additionalProperties": False},
    }
    called = client.messages.create(
        model="kimi-k3.1-pro",
        max_tokens=256,
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[tool],
        tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
    )
    use = called.content[-1]
    assert called.stop_reason == "tool_use" and use.type == "tool_use" and isinstance(use.input, dict)
    with pytest.raises(anthropic.NotFoundError) as unknown:
        client.messages.create(model="kimi-nope", max_tokens=8, messages=hello)
    assert unknown.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]


def test_token_estimates_are_the_upstreams_own_billed_counts(front: LiveServer) -> None:
    """Through llama.cpp's server the estimate is its own tokenizer's count of the body the request
    would send, so it equals the prompt_tokens the upstream reports and the request is billed."""
    headers = {"Authorization": f"Bearer {front.key}"}
    for extra in ({}, {"tools": [WEATHER]}):
        body: dict[str, Any] = {"model": "kimi-k3.1-pro", "messages": [*PROMPT, *MORE_TURNS], **extra}
        r = httpx.post(front.base_url + "/tokenizers/estimate-token-count", json=body, headers=headers, timeout=60)
        assert r.status_code == 200, r.text
        billed = sdk(front).chat.completions.create(**body, max_completion_tokens=4)
        assert billed.usage is not None and r.json()["data"]["total_tokens"] == billed.usage.prompt_tokens
