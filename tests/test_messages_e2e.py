"""The Messages door on the real embedded model (smollm2-135m through llama.cpp), through the pinned
``anthropic`` SDK: create, a stream rebuilt by the SDK's own accumulator, a tool call and its
result, a thinking block sent back (and a tampered one refused), count_tokens equal to the billed
input, a repeated cache_control prefix read from the prompt cache, and errors in Anthropic's shape."""

from __future__ import annotations

from typing import Any

import anthropic
import pytest

from tests.conftest import LiveServer

pytestmark = pytest.mark.e2e

MODEL = "kimi-k3.1-pro"
# A system prompt long enough to be worth caching, the same on every request here.
SYSTEM: Any = [
    {"type": "text", "text": "You are a terse assistant. " + "Answer in one short sentence. " * 40},
    {"type": "text", "text": "Never use lists.", "cache_control": {"type": "ephemeral"}},
]


def sdk(server: LiveServer, key: str | None = None) -> anthropic.Anthropic:
    base = server.base_url.removesuffix("/v1") + "/anthropic"
    return anthropic.Anthropic(base_url=base, api_key=key or server.key, max_retries=0, timeout=600)


def billed_input(usage: anthropic.types.Usage) -> int:
    return usage.input_tokens + (usage.cache_read_input_tokens or 0) + (usage.cache_creation_input_tokens or 0)


def test_create_stream_and_count(live_server: LiveServer) -> None:
    client = sdk(live_server)
    messages: Any = [{"role": "user", "content": "Name a colour."}]
    created = client.messages.create(
        model=MODEL, max_tokens=48, system=SYSTEM, messages=messages, output_config={"effort": "low"}
    )
    assert created.content[0].type == "thinking" and created.content[0].signature
    assert created.content[-1].type == "text" and created.stop_reason in ("end_turn", "max_tokens")
    counted = client.messages.count_tokens(model=MODEL, system=SYSTEM, messages=messages)
    assert counted.input_tokens == billed_input(created.usage)
    with client.messages.stream(
        model=MODEL, max_tokens=48, system=SYSTEM, messages=messages, output_config={"effort": "low"}
    ) as stream:
        texts = [
            event.delta.text
            for event in stream
            if event.type == "content_block_delta" and event.delta.type == "text_delta"
        ]
        rebuilt = stream.get_final_message()
    assert rebuilt.content[-1].type == "text" and rebuilt.content[-1].text == "".join(texts)
    assert rebuilt.usage.output_tokens > 0 and rebuilt.stop_reason in ("end_turn", "max_tokens")
    # The same prefix again: read from the prompt cache, not written again.
    assert (rebuilt.usage.cache_read_input_tokens or 0) > 0


def test_tool_call_then_result(live_server: LiveServer) -> None:
    client = sdk(live_server)
    tools: Any = [
        {
            "name": "get_weather",
            "description": "The weather in a city.",
            # Closed, and one call: left open, the tiny model was seen (1 in 30) to add made-up
            # properties to two calls until the cap ended them.
            "input_schema": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
                "additionalProperties": False,
            },
        }
    ]
    question: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
    called = client.messages.create(
        model=MODEL,
        max_tokens=400,
        messages=question,
        tools=tools,
        tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
        output_config={"effort": "low"},
    )
    use = called.content[-1]
    assert called.stop_reason == "tool_use" and use.type == "tool_use"
    assert use.name == "get_weather" and isinstance(use.input, dict) and isinstance(use.input["city"], str)
    history: Any = [
        *question,
        {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in called.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "Sunny, 21 C."}]},
    ]
    answered = client.messages.create(
        model=MODEL, max_tokens=48, messages=history, tools=tools, output_config={"effort": "low"}
    )
    assert answered.content[-1].type in ("text", "tool_use")
    # The thinking block went back with its signature; tampered with, it is refused.
    thinking = history[1]["content"][0]
    assert thinking["type"] == "thinking"
    history[1]["content"][0] = {**thinking, "thinking": thinking["thinking"] + " (edited)"}
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(model=MODEL, max_tokens=48, messages=history, tools=tools)
    assert refused.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]


def test_errors_in_anthropic_shape(live_server: LiveServer) -> None:
    client = sdk(live_server)
    one: Any = [{"role": "user", "content": "Hi"}]
    cases: list[tuple[type[anthropic.APIStatusError], str, Any]] = [
        (
            anthropic.AuthenticationError,
            "authentication_error",
            lambda: sdk(live_server, "sk-nope").messages.create(model=MODEL, max_tokens=8, messages=one),
        ),
        (
            anthropic.NotFoundError,
            "not_found_error",
            lambda: client.messages.create(model="kimi-x", max_tokens=8, messages=one),
        ),
        (
            anthropic.BadRequestError,
            "invalid_request_error",
            lambda: client.messages.create(
                model=MODEL, max_tokens=8, messages=one, thinking={"type": "enabled", "budget_tokens": 10}
            ),
        ),
    ]
    for kind, name, call in cases:
        with pytest.raises(kind) as raised:
            call()
        assert raised.value.body["error"]["type"] == name  # type: ignore[index]
