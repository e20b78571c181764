"""Token estimation end to end on the real tiny model: the estimate of a Chat Completions body
equals the ``prompt_tokens`` the same request is billed (the model's own tokenizer over the same
rendered prompt), for a conversation with tools, a multi-turn one and one in several scripts."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from tests.conftest import LiveServer

pytestmark = pytest.mark.e2e

MODEL = "kimi-k3.1-pro"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CONVERSATIONS: dict[str, dict[str, Any]] = {
    "tools": {
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": [WEATHER],
    },
    "multi-turn": {
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Name a colour."},
            {"role": "assistant", "content": "Blue."},
            {"role": "user", "content": "Another one?"},
        ]
    },
    "unicode": {"messages": [{"role": "user", "content": "Traduis « bonjour » : 你好, こんにちは, привет, 🙂?"}]},
}


@pytest.mark.parametrize("name", list(CONVERSATIONS))
def test_the_estimate_equals_the_billed_prompt_tokens(live_server: LiveServer, name: str) -> None:
    body = {"model": MODEL, **CONVERSATIONS[name]}
    estimate = httpx.post(
        live_server.base_url + "/tokenizers/estimate-token-count",
        json=body,
        headers={"Authorization": f"Bearer {live_server.key}"},
        timeout=60,
    )
    assert estimate.status_code == 200, estimate.text
    total = estimate.json()["data"]["total_tokens"]
    client = openai.OpenAI(base_url=live_server.base_url, api_key=live_server.key, max_retries=0, timeout=300)
    answer = client.chat.completions.create(**body, reasoning_effort="low", max_completion_tokens=24)
    assert answer.usage is not None
    assert total == answer.usage.prompt_tokens
