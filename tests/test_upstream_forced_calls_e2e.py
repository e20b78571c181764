"""Forced tool calls through llama.cpp's own server, which does not constrain ``tool_choice``
"required" itself: kimi-server asks it for a JSON answer under a schema only a call satisfies
and hands the client ``tool_calls``, streamed and not, through the openai SDK. Also: requests
that name ``tool_choice`` "auto" (or its kin) without tools answer, here and on the embedded
default model."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest

from tests.conftest import LiveServer, start_server, stop_server
from tests.upstreams.fixtures import llamacpp_server

pytestmark = pytest.mark.e2e

WEATHER_PARAMS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 1, "maxLength": 24},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME_PARAMS = {
    "type": "object",
    "properties": {"zone": {"type": "string", "maxLength": 24}},
    "required": ["zone"],
    "additionalProperties": False,
}
TOOLS: Any = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city.",
            "parameters": WEATHER_PARAMS,
            "strict": True,
        },
    },
    {
        "type": "function",
        "function": {"name": "get_time", "description": "Time in a zone.", "parameters": TIME_PARAMS, "strict": True},
    },
]
PARAMS = {"get_weather": WEATHER_PARAMS, "get_time": TIME_PARAMS}
ASK: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
NAMED: Any = {"type": "function", "function": {"name": "get_time"}}
# Room for the JSON's whitespace: llama.cpp's JSON grammar lets the tiny model indent freely.
CAP = 160


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with llamacpp_server(tmp_path_factory.mktemp("llamacpp")) as url:
        yield url


def serve(tmp: Path, upstream: str, dialect: str) -> Iterator[LiveServer]:
    proc, server = start_server(tmp, "--upstream", upstream, "--upstream-dialect", dialect, "--model", "no-such-model")
    try:
        yield server
    finally:
        stop_server(proc)


@pytest.fixture(scope="module")
def front(tmp_path_factory: pytest.TempPathFactory, upstream: str) -> Iterator[LiveServer]:
    yield from serve(tmp_path_factory.mktemp("forced-calls"), upstream, "llamacpp")


@pytest.fixture(scope="module")
def openai_front(tmp_path_factory: pytest.TempPathFactory, upstream: str) -> Iterator[LiveServer]:
    """The default dialect, which passes tool_choice as given and trusts nothing it gets back."""
    yield from serve(tmp_path_factory.mktemp("forced-calls-openai"), upstream, "openai")


def sdk(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key=server.key, max_retries=0, timeout=300)


def valid_call(name: str, arguments: str) -> None:
    assert name in PARAMS
    jsonschema.validate(json.loads(arguments), PARAMS[name])


@pytest.mark.parametrize("choice", ["required", NAMED], ids=["required", "named"])
def test_forced_call_plain(front: LiveServer, choice: Any) -> None:
    resp = sdk(front).chat.completions.create(
        model="kimi-k3.1-pro", messages=ASK, tools=TOOLS, tool_choice=choice, max_completion_tokens=CAP
    )
    choice_out = resp.choices[0]
    assert choice_out.finish_reason == "tool_calls"
    [call] = choice_out.message.tool_calls or []
    assert call.type == "function" and call.id.startswith("call_")
    valid_call(call.function.name, call.function.arguments)
    if choice == NAMED:
        assert call.function.name == "get_time"
    assert not choice_out.message.content
    usage = resp.usage
    assert usage is not None and usage.prompt_tokens > 0
    assert 0 < usage.completion_tokens <= CAP
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


@pytest.mark.parametrize("choice", ["required", NAMED], ids=["required", "named"])
def test_forced_call_streamed(front: LiveServer, choice: Any) -> None:
    stream = sdk(front).chat.completions.create(
        model="kimi-k3.1-pro",
        messages=ASK,
        tools=TOOLS,
        tool_choice=choice,
        max_completion_tokens=CAP,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    # The first delta opens the call (id, name); the arguments follow as they are generated.
    first = deltas[0]
    assert first.index == 0 and first.id and first.type == "function" and first.function is not None
    assert all(d.index == 0 and d.id is None for d in deltas[1:])
    assert len(deltas) > 1
    name = first.function.name or ""
    valid_call(name, "".join(d.function.arguments or "" for d in deltas if d.function))
    if choice == NAMED:
        assert name == "get_time"
    assert not "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["tool_calls"]
    usage = chunks[-1].usage
    assert usage is not None and 0 < usage.completion_tokens <= CAP
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_forced_call_in_responses(front: LiveServer) -> None:
    tools: Any = [{"type": "function", **t["function"]} for t in TOOLS]
    resp = sdk(front).responses.create(
        model="kimi-k3.1-pro",
        input="What time is it in Tokyo?",
        tools=tools,
        tool_choice={"type": "function", "name": "get_time"},
        max_output_tokens=CAP,
    )
    [call] = [item for item in resp.output if item.type == "function_call"]
    assert call.name == "get_time"
    valid_call(call.name, call.arguments)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize("choice", ["required", NAMED], ids=["required", "named"])
def test_forced_call_through_the_openai_dialect_ends_in_a_call(
    openai_front: LiveServer, choice: Any, stream: bool
) -> None:
    """llama.cpp's server is sent tool_choice as is (it answers this model with text); the
    client gets a valid call all the same."""
    client = sdk(openai_front)
    ask: Any = {"model": "kimi-k3.1-pro", "messages": ASK, "tools": TOOLS, "tool_choice": choice}
    if stream:
        chunks = list(client.chat.completions.create(**ask, max_completion_tokens=CAP, stream=True))
        deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
        assert deltas and deltas[0].function is not None
        name = deltas[0].function.name or ""
        arguments = "".join(d.function.arguments or "" for d in deltas if d.function)
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        assert finishes == ["tool_calls"]
        assert not "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    else:
        out = client.chat.completions.create(**ask, max_completion_tokens=CAP).choices[0]
        assert out.finish_reason == "tool_calls" and not out.message.content
        [call] = out.message.tool_calls or []
        assert call.type == "function"
        name, arguments = call.function.name, call.function.arguments
    valid_call(name, arguments)
    if choice == NAMED:
        assert name == "get_time"


KIN: list[dict[str, Any]] = [
    {"tool_choice": "auto"},
    {"tool_choice": "none"},
    {"tool_choice": "auto", "tools": []},
    {"parallel_tool_calls": True},
]


@pytest.mark.parametrize("extra", KIN, ids=["auto", "none", "auto-empty-tools", "parallel"])
def test_tool_choice_without_tools_answers_through_the_upstream(front: LiveServer, extra: dict[str, Any]) -> None:
    resp = sdk(front).chat.completions.create(
        model="kimi-k3.1-pro",
        messages=[{"role": "user", "content": "Say hello."}],
        max_completion_tokens=8,
        **extra,
    )
    assert resp.choices[0].message.content
    assert resp.choices[0].finish_reason in ("stop", "length")


def test_tool_choice_auto_without_tools_answers_on_the_default_model(default_model_server: LiveServer) -> None:
    client = sdk(default_model_server)
    # As a verification suite sends it: no tools, no output cap.
    resp = client.chat.completions.create(
        model="kimi-k3",
        messages=[{"role": "user", "content": "What is 2 + 2? Answer with the number."}],
        tool_choice="auto",
    )
    assert resp.choices[0].message.content
    assert resp.choices[0].finish_reason == "stop"
    stream = client.chat.completions.create(
        model="kimi-k3",
        messages=[{"role": "user", "content": "Say hello."}],
        tool_choice="auto",
        tools=[],
        max_completion_tokens=16,
        stream=True,
    )
    chunks = list(stream)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes in (["stop"], ["length"])
