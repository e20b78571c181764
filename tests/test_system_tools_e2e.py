"""End to end: tools declared only in a system message are callable on the real default model
(qwen2.5-coder-0.5b through llama.cpp), through the official openai SDK, on both endpoints,
streamed and not, under both contract profiles (a server on ``--contract moonshot`` with one
route kept on evolink). The call is constrained to the tools in force, so it always names a
declared tool with arguments valid against its schema."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.conftest import DEFAULT_MODEL, LiveServer, start_server, stop_server

pytestmark = pytest.mark.e2e

MOONSHOT_MODEL = "kimi-k3.1-pro"
EVOLINK_MODEL = "kimi-k3.1-pro-highspeed"
PARAMS = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}
QUESTION = "What's the weather like in Paris right now?"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    routes = json.dumps({EVOLINK_MODEL: {"contract": "evolink"}})
    env = {"KIMI_ROUTES": routes, "KIMI_THREADS": os.environ.get("KIMI_THREADS", "1")}
    proc, live = start_server(
        tmp_path_factory.mktemp("system-tools"), "--model", DEFAULT_MODEL, "--contract", "moonshot", env=env
    )
    try:
        yield live
    finally:
        stop_server(proc)


def sdk(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key=server.key, max_retries=0, timeout=900)


def chat_messages() -> Any:
    weather = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "strict": True,
            "description": "Current weather for a city.",
            "parameters": PARAMS,
        },
    }
    return [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "system", "content": "", "tools": [weather]},
        {"role": "user", "content": QUESTION},
    ]


def assert_weather_call(name: str | None, arguments: str) -> None:
    assert name == "get_weather"
    args = json.loads(arguments)
    assert set(args) == {"city"} and isinstance(args["city"], str)


@pytest.mark.parametrize(("model", "stream"), [(MOONSHOT_MODEL, False), (EVOLINK_MODEL, True)])
def test_chat_calls_a_declared_tool(server: LiveServer, model: str, stream: bool) -> None:
    kw: Any = {
        "model": model,
        "messages": chat_messages(),
        "tool_choice": "required",
        "reasoning_effort": "low",
        "max_completion_tokens": 160,
        "seed": 7,
    }
    if not stream:
        resp = sdk(server).chat.completions.create(**kw)
        assert resp.choices[0].finish_reason == "tool_calls", resp.choices[0].message
        answered: Any = resp.choices[0].message.tool_calls
        assert answered
        assert_weather_call(answered[0].function.name, answered[0].function.arguments)
        return
    kw["tool_choice"] = {"type": "function", "function": {"name": "get_weather"}}
    calls: dict[int, list[str]] = {}  # index -> [name, arguments]
    finish = None
    for chunk in sdk(server).chat.completions.create(**kw, stream=True):
        if not chunk.choices:
            continue
        finish = chunk.choices[0].finish_reason or finish
        for delta in chunk.choices[0].delta.tool_calls or ():
            call = calls.setdefault(delta.index, ["", ""])
            if delta.function and delta.function.name:
                call[0] = delta.function.name
            call[1] += (delta.function.arguments or "") if delta.function else ""
    assert finish == "tool_calls" and calls
    for name, arguments in calls.values():
        assert_weather_call(name, arguments)


@pytest.mark.parametrize(("model", "stream"), [(MOONSHOT_MODEL, True), (EVOLINK_MODEL, False)])
def test_responses_calls_a_tool_a_developer_item_declares(server: LiveServer, model: str, stream: bool) -> None:
    weather = {
        "type": "function",
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": PARAMS,
    }
    items: Any = [{"role": "developer", "content": "", "tools": [weather]}, {"role": "user", "content": QUESTION}]
    kw: Any = {
        "model": model,
        "input": items,
        "tool_choice": "required",
        "reasoning": {"effort": "low"},
        "max_output_tokens": 160,
    }
    if stream:
        events = list(sdk(server).responses.create(**kw, stream=True))
        assert events[-1].type == "response.completed", [e.type for e in events]
        final = events[-1].response
        done = [e.arguments for e in events if e.type == "response.function_call_arguments.done"]
    else:
        final = sdk(server).responses.create(**kw)
    calls = [o for o in final.output if o.type == "function_call"]
    assert calls
    for call in calls:
        assert_weather_call(call.name, call.arguments)
    if stream:  # the streamed arguments are the final object's
        assert done == [call.arguments for call in calls]
