"""Long prompts against the real server (real tiny model through llama.cpp): another key keeps
getting its tokens while one key's ~6,000-token multi-line prompt is read, and the size checks
and the TPM reservation use the model's own token count, not a characters-per-token guess."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import LiveServer, start_server, stop_server
from tests.gateway_util import ADMIN_KEY

pytestmark = pytest.mark.e2e

MODEL = "kimi-k3.1-pro"
LONG = "a\nb\nc\n" * 1000  # one token per character: ~6,000 tokens, ~1,500 by characters / 4
WINDOW = 2048
BOUND = 1000


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def chat(content: str, tokens: int, **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "reasoning_effort": "low",
        "max_completion_tokens": tokens,
        **extra,
    }


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    proc, live = start_server(tmp_path_factory.mktemp("prefill"), "--parallel", "2")
    try:
        yield live
    finally:
        stop_server(proc)


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A small window, an operator bound on prompts, and the admin API for keys with a TPM."""
    env = {"KIMI_MAX_PROMPT_TOKENS": str(BOUND), "KIMI_ADMIN_KEY": ADMIN_KEY}
    proc, live = start_server(tmp_path_factory.mktemp("small"), "--ctx-size", str(WINDOW), env=env)
    try:
        yield live
    finally:
        stop_server(proc)


# -- fairness -----------------------------------------------------------------------------------


async def _engine_calls(client: httpx.AsyncClient, live: LiveServer, key: str) -> int:
    r = await client.get(live.base_url + "/engine/stats", headers=auth(key))
    return int(r.json()["data"][0]["active_calls"])


async def _quiet_stream_beside_long_prompt(live: LiveServer) -> tuple[int, bool]:
    """Tokens the quiet key streamed, and whether the long prompt was still being read when
    the quiet stream ended."""
    url = live.base_url + "/chat/completions"
    async with httpx.AsyncClient(timeout=600) as client:
        long = asyncio.create_task(client.post(url, json=chat(LONG, 4), headers=auth(live.other_key)))
        for _ in range(3000):  # until the long prompt's llama.cpp call is in flight
            if long.done() or await _engine_calls(client, live, live.other_key) > 0:
                break
            await asyncio.sleep(0.05)
        tokens = 0
        quiet = chat("Tell me a story.", 16, stream=True)
        async with client.stream("POST", url, json=quiet, headers=auth(live.key)) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    delta = json.loads(line[6:])["choices"][0]["delta"]
                    tokens += bool(delta.get("content") or delta.get("reasoning_content"))
        still_reading = not long.done()
        long.cancel()  # the client leaves: the server stops that slot
        await asyncio.gather(long, return_exceptions=True)
        return tokens, still_reading


def test_another_key_streams_its_answer_while_a_long_prompt_is_read(shared: LiveServer) -> None:
    # With llama.cpp's 2,048-token batches the quiet key got one token per batch (or none until
    # the long prompt was read, on a higher slot): the long request was answered first.
    tokens, still_reading = asyncio.run(_quiet_stream_beside_long_prompt(shared))
    assert tokens >= 8
    assert still_reading, "the quiet key's stream ended only after the long prompt was read"


# -- size by real tokens ------------------------------------------------------------------------


def _post(live: LiveServer, body: dict[str, Any], key: str | None = None) -> httpx.Response:
    return httpx.post(live.base_url + "/chat/completions", json=body, headers=auth(key or live.key), timeout=300)


def _tokens_named(message: str) -> int:
    found = re.search(r"is (\d+) tokens long", message)
    assert found, message
    return int(found.group(1))


def test_a_prompt_that_fits_by_characters_but_not_by_tokens_gets_a_400(small: LiveServer) -> None:
    text = "a\nb\nc\n" * 340  # 2,040 characters: 510 by characters / 4, over 2,040 tokens
    r = _post(small, chat(text, 16))
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == "messages"
    assert _tokens_named(error["message"]) >= len(text)
    assert f"context window of {WINDOW} tokens" in error["message"]


def test_a_prompt_over_the_operator_bound_gets_a_400_naming_both_numbers(small: LiveServer) -> None:
    text = "a\nb\nc\n" * 200  # fits the window, not the bound
    r = _post(small, chat(text, 16))
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert _tokens_named(error["message"]) >= len(text) > BOUND
    assert f"at most {BOUND} tokens" in error["message"]


# -- TPM by real tokens -------------------------------------------------------------------------


def _key(live: LiveServer, **limits: int) -> str:
    admin = live.base_url.removesuffix("/v1") + "/admin/v1/keys"
    name = "tpm-" + "-".join(str(v) for v in limits.values())
    r = httpx.post(admin, json={"name": name, **limits}, headers=auth(ADMIN_KEY), timeout=30)
    assert r.status_code == 200, r.text
    return str(r.json()["secret"])


def test_the_tpm_reservation_is_the_prompts_real_token_count(small: LiveServer) -> None:
    key = _key(small, tpm=6000)
    r = _post(small, chat("a\nb\nc\n" * 20, 5), key)
    assert r.status_code == 200, r.text
    prompt = r.json()["usage"]["prompt_tokens"]  # llama.cpp's own count
    reserved = 6000 - int(r.headers["x-ratelimit-remaining-tokens"])
    assert abs(reserved - (prompt + 5)) <= 1


async def _second_request_while_first_runs(live: LiveServer, key: str, first: dict[str, Any]) -> httpx.Response:
    url = live.base_url + "/chat/completions"
    async with httpx.AsyncClient(timeout=600) as client:
        running = asyncio.create_task(client.post(url, json=first, headers=auth(key)))
        for _ in range(3000):  # until the first request's llama.cpp call is in flight
            if running.done() or await _engine_calls(client, live, key) > 0:
                break
            await asyncio.sleep(0.05)
        second = await client.post(url, json=chat("Hi.", 4), headers=auth(key))
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        return second


def test_a_tpm_limit_the_real_count_exceeds_gets_a_429(small: LiveServer) -> None:
    # 900 characters, 1,100 tokens of output: reserved by characters (~330 + 1,100) the first
    # request leaves tokens in a 1,500 TPM for the second; reserved by its real count (~930 +
    # 1,100) it overdraws the minute, and the second is refused.
    key = _key(small, tpm=1500)
    second = asyncio.run(_second_request_while_first_runs(small, key, chat("a\nb\nc\n" * 150, 1100)))
    assert second.status_code == 429, second.text
    assert second.json()["error"]["type"] == "tokens"


def test_a_prompt_read_in_turns_reports_only_its_real_cache_hit(small: LiveServer) -> None:
    # ~700 tokens: read in turns (64 tokens each, alone). The turns must not pass for cache
    # hits, and a real hit longer than many turns must be reported whole.
    text = "".join(f"line {i}: ok\n" for i in range(120))
    first = _post(small, chat(text, 4)).json()["usage"]
    assert first["prompt_tokens"] > 512
    assert first["prompt_tokens_details"]["cached_tokens"] == 0
    again = _post(small, chat(text, 4)).json()["usage"]
    assert again["prompt_tokens"] == first["prompt_tokens"]
    assert again["prompt_tokens_details"]["cached_tokens"] > 512
