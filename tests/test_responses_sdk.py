"""The official openai SDK, unchanged, over the scripted engine (the HTTP client is the test
client): the stream accumulator accepts our event order and indices, tool calls included."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from fastapi.testclient import TestClient
from openai import OpenAI
from pydantic import BaseModel

from kimi_server.engines.scripted import Script, ScriptedEngine
from kimi_server.engines.types import ToolCallDelta
from tests.conftest import TEST_KEY
from tests.responses_util import weather_tool


@pytest.fixture
def sdk(client: TestClient) -> OpenAI:
    return OpenAI(base_url="http://testserver/v1", api_key=TEST_KEY, http_client=client)


def test_stream_helper_accumulates_text_and_tool_calls(sdk: OpenAI, engine: ScriptedEngine) -> None:
    engine.script = Script(
        content=("Let me check.",),
        tool_calls=(
            ToolCallDelta(0, "call_a", "get_weather", '{"city":'),
            ToolCallDelta(0, None, None, '"Oslo"}'),
            ToolCallDelta(1, "call_b", "get_weather", '{"city":"Rome"}'),
        ),
    )
    tool: Any = weather_tool()  # the SDK's types require "strict", which the API leaves optional
    with sdk.responses.stream(
        model="kimi-k3.1-pro",
        input="Weather in Oslo and Rome?",
        reasoning={"effort": "low"},
        tools=[tool],
    ) as stream:
        final = stream.get_final_response()
    assert final.output_text == "Let me check."
    calls = [o for o in final.output if o.type == "function_call"]
    assert [(c.call_id, c.arguments) for c in calls] == [
        ("call_a", '{"city":"Oslo"}'),
        ("call_b", '{"city":"Rome"}'),
    ]
    assert final.output[0].type == "reasoning" and final.output[0].encrypted_content


def test_create_and_round_trip_with_sdk_objects(sdk: OpenAI, engine: ScriptedEngine) -> None:
    first = sdk.responses.create(model="kimi-k3.1-pro", input="Hi!", reasoning={"effort": "low"})
    assert first.output_text == "Hello there." and (first.model_extra or {})["store"] is False
    # The SDK takes its own output items back as input, which its parameter types do not say.
    items: list[Any] = [{"role": "user", "content": "Hi!"}, *first.output, {"role": "user", "content": "Again."}]
    second = sdk.responses.create(model="kimi-k3.1-pro", input=items, reasoning={"effort": "low"})
    assert second.status == "completed"
    assert engine.requests[-1].messages[1].reasoning == "Let me think."


def test_sdk_raises_bad_request_for_stateful_fields(sdk: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.responses.create(model="kimi-k3.1-pro", input="Hi", previous_response_id="resp_1")
    assert "previous_response_id" in str(caught.value)


class Greeting(BaseModel):
    text: str


def test_parse_with_a_pydantic_format(sdk: OpenAI, engine: ScriptedEngine) -> None:
    engine.script = Script(content=('{"text": ', '"hello"}'))
    parsed = sdk.responses.parse(
        model="kimi-k3.1-pro", input="Greet.", reasoning={"effort": "low"}, text_format=Greeting
    )
    assert parsed.output_parsed == Greeting(text="hello")
    fmt = engine.requests[-1].output_format
    assert fmt.kind == "json_schema" and fmt.schema is not None
    assert fmt.schema["properties"]["text"]["type"] == "string"
