"""``tool_choice: "auto"`` with the default model (qwen2.5-coder-0.5b): a greeting gets text, a
request the tool obviously serves gets a call.

The default model decodes at roughly 20 tokens/s on two cores; the questions are short and the
effort low, so the four requests stay within a minute or two. ``scripts/test`` pulls the model.
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionFunctionToolParam

from tests.conftest import LiveServer

pytestmark = pytest.mark.e2e

WEATHER: ChatCompletionFunctionToolParam = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


@pytest.fixture
def qwen(default_model_server: LiveServer) -> LiveServer:
    # The session's one default-model server (tests/conftest.py); it pulls the model if missing.
    return default_model_server


def ask(server: LiveServer, question: str) -> Any:
    sdk = openai.OpenAI(base_url=server.base_url, api_key=server.key, max_retries=0, timeout=900)
    return sdk.chat.completions.create(
        model="kimi-k3.1-pro",
        reasoning_effort="low",
        max_completion_tokens=160,
        seed=7,
        messages=[{"role": "user", "content": question}],
        tools=[WEATHER],
        tool_choice="auto",
    )


@pytest.mark.parametrize("greeting", ["Hi! How are you?", "Hello there!"])
def test_greeting_gets_text(qwen: LiveServer, greeting: str) -> None:
    r = ask(qwen, greeting)
    message = r.choices[0].message
    assert not message.tool_calls, message
    assert r.choices[0].finish_reason in ("stop", "length")
    assert (message.content or "").strip()


@pytest.mark.parametrize("city", ["Paris", "Tokyo"])
def test_weather_request_gets_a_call(qwen: LiveServer, city: str) -> None:
    r = ask(qwen, f"What's the weather like in {city} right now?")
    calls = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls", r.choices[0].message
    assert calls and calls[0].function.name == "get_weather"
    assert city.lower() in json.loads(calls[0].function.arguments)["city"].lower()
