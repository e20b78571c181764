"""End to end: the real server, the real tiny model through llama.cpp, the official openai SDK."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from openai.types.shared_params import ReasoningEffort

from tests.conftest import LiveServer

pytestmark = pytest.mark.e2e

PROMPT: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Name three colours."}]


def sdk(server: LiveServer, key: str | None = None) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key=key or server.key, max_retries=0, timeout=600)


def test_plain_completion_has_reasoning_and_content(live_server: LiveServer) -> None:
    resp = sdk(live_server).chat.completions.create(
        model="kimi-k3.1-pro", messages=PROMPT, reasoning_effort="low", max_completion_tokens=200
    )
    message = resp.choices[0].message
    extra: dict[str, Any] = message.model_extra or {}
    assert extra["reasoning_content"].strip()
    assert message.content and message.content.strip()
    usage = resp.usage
    assert usage is not None and usage.completion_tokens_details is not None
    reasoning = usage.completion_tokens_details.reasoning_tokens or 0
    # Every token generated is counted once: an answer that is the chosen attempt adds none.
    assert 0 < reasoning <= usage.completion_tokens <= 200
    if message.content.strip() in extra["reasoning_content"] and resp.choices[0].finish_reason == "stop":
        assert usage.completion_tokens == reasoning
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert resp.choices[0].finish_reason in ("stop", "length")


def test_stream_reasoning_precedes_content_and_usage_adds_up(live_server: LiveServer) -> None:
    stream = sdk(live_server).chat.completions.create(
        model="kimi-k3.1-pro-highspeed",
        messages=PROMPT,
        reasoning_effort="low",
        max_completion_tokens=200,
        stream=True,
        stream_options={"include_usage": True},
    )
    order: list[str] = []
    usage = None
    finish = None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            delta_extra: dict[str, Any] = choice.delta.model_extra or {}
            if delta_extra.get("reasoning_content"):
                order.append("r")
            if choice.delta.content:
                order.append("c")
            finish = choice.finish_reason or finish
    assert "r" in order and "c" in order
    assert order.index("c") > max(i for i, k in enumerate(order) if k == "r")
    assert finish in ("stop", "length")
    assert usage is not None and usage.completion_tokens_details is not None
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert 0 < (usage.completion_tokens_details.reasoning_tokens or 0) <= usage.completion_tokens


def test_errors_through_the_sdk(live_server: LiveServer) -> None:
    with pytest.raises(openai.AuthenticationError):
        sdk(live_server, "sk-wrong").chat.completions.create(model="kimi-k3.1-pro", messages=PROMPT)
    client = sdk(live_server)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="kimi-k9", messages=PROMPT)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="kimi-k3", messages=PROMPT, temperature=0.5)
    assert "temperature" in str(info.value)
    ok = client.chat.completions.create(
        model="kimi-k3.1-pro", messages=PROMPT, temperature=0.5, reasoning_effort="low", max_completion_tokens=60
    )
    assert ok.choices[0].message.model_extra


def test_low_effort_reasons_less_than_max(live_server: LiveServer) -> None:
    client = sdk(live_server)

    def reasoning_tokens(effort: ReasoningEffort) -> int:
        resp = client.chat.completions.create(
            model="kimi-k3.1-pro", messages=PROMPT, reasoning_effort=effort, max_completion_tokens=300, seed=7
        )
        assert resp.usage and resp.usage.completion_tokens_details
        return resp.usage.completion_tokens_details.reasoning_tokens or 0

    assert reasoning_tokens("low") < reasoning_tokens("max")


def test_eight_concurrent_streams_complete(live_server: LiveServer) -> None:
    async def one(client: openai.AsyncOpenAI, i: int) -> tuple[str, int]:
        stream = await client.chat.completions.create(
            model="kimi-k3.1-pro",
            messages=[{"role": "user", "content": f"Count to {i + 3}."}],
            reasoning_effort="low",
            max_completion_tokens=64,
            stream=True,
            stream_options={"include_usage": True},
        )
        text, tokens = "", 0
        async for chunk in stream:
            if chunk.usage:
                tokens = chunk.usage.completion_tokens
            for choice in chunk.choices:
                text += choice.delta.content or ""
        return text, tokens

    async def main() -> list[tuple[str, int]]:
        # Closed on the way out: its pooled connections go with the loop, not to the collector.
        async with openai.AsyncOpenAI(
            base_url=live_server.base_url, api_key=live_server.key, max_retries=0, timeout=300
        ) as client:
            return await asyncio.gather(*(one(client, i) for i in range(8)))

    results = asyncio.run(main())
    assert len(results) == 8
    assert all(tokens > 0 for _, tokens in results)


def test_client_disconnect_cancels_generation(live_server: LiveServer) -> None:
    headers = {"Authorization": f"Bearer {live_server.key}"}
    stats_url = live_server.base_url + "/engine/stats"
    before = httpx.get(stats_url, headers=headers).json()["data"][0]["cancelled_calls"]
    body = {
        "model": "kimi-k3.1-pro",
        "messages": [{"role": "user", "content": "Write a very long story about a lighthouse."}],
        "stream": True,
        "max_completion_tokens": 100000,
    }
    url = live_server.base_url + "/chat/completions"
    with httpx.stream("POST", url, json=body, headers=headers, timeout=60) as resp:
        assert resp.status_code == 200
        lines = resp.iter_lines()
        got = [next(lines) for _ in range(6)]
        assert any("reasoning_content" in line for line in got)
    deadline = time.monotonic() + 30
    after = before
    while time.monotonic() < deadline:
        data = httpx.get(stats_url, headers=headers).json()["data"][0]
        after = data["cancelled_calls"]
        if after > before and data["active_calls"] == 0:
            break
        time.sleep(0.2)
    assert after > before
