"""The server's own count of a llama.cpp upstream's tokens (used when an upstream sends no usage)
against a real llama.cpp server: it equals the count llama.cpp reports for the same request."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from kimi_server.engines.types import ContentDelta
from kimi_server.engines.upstream.counting import TokenCounter, Transcript
from kimi_server.engines.upstream.relay import Upstream
from kimi_server.settings import UpstreamConfig
from tests.upstreams.fixtures import llamacpp_server

pytestmark = pytest.mark.e2e

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with llamacpp_server(tmp_path_factory.mktemp("tokenizer-e2e")) as url:
        yield url


def engine_and_server_counts(url: str, body: dict[str, Any]) -> tuple[dict[str, Any], tuple[int, int]]:
    reply = httpx.post(f"{url}/chat/completions", json=body, timeout=300).json()
    choice = reply["choices"][0]
    transcript = Transcript()
    transcript.add(ContentDelta(choice["message"].get("content") or ""))
    transcript.stopped = choice["finish_reason"] != "length"

    async def count() -> tuple[int, int]:
        up = Upstream(UpstreamConfig(base_url=url, dialect="llamacpp"))
        try:
            counts = await TokenCounter(up).count(body, transcript, need_prompt=True)
        finally:
            await up.close()
        assert counts.source == "server_count"
        return counts.prompt, counts.completion

    return reply["usage"], asyncio.run(count())


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": "Say hello."}],
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "a\nb\r\nc\n" * 40 + "Name a colour."},
        ],
        [{"role": "user", "content": "Naïve café, 東京, emoji 🤗: 3.14159"}],
    ],
)
def test_counts_equal_llamacpps_own(upstream: str, messages: list[dict[str, Any]]) -> None:
    for extra in ({}, {"tools": [WEATHER]}):
        body = {"model": "m", "messages": messages, "max_tokens": 6, "temperature": 0, "seed": 1, **extra}
        usage, (prompt, completion) = engine_and_server_counts(upstream, body)
        assert prompt == usage["prompt_tokens"] > 0
        assert completion == usage["completion_tokens"] > 0
