"""Prompt caching end to end: the real server, the real tiny model, the official openai SDK.

``cached_tokens`` comes from llama.cpp (``timings.cache_n``: prompt tokens whose KV was reused),
so these tests see real reuse. llama.cpp always evaluates the last prompt token again; and a
request whose answer phase ran (an answer under a grammar, or the draft path) leaves its slot
holding the answer's prompt, where the chosen attempt's system turn follows the conversation in
place of the assistant turn's opening, so a fully cached prompt reports between
``prompt_tokens - REREAD`` and ``prompt_tokens - 1`` cached (``fully_cached``), the rest
written. A free-text answer is the chosen attempt itself and runs no answer phase.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import TEST_KEY, LiveServer, start_server, stop_server

pytestmark = pytest.mark.e2e

K31, K3 = "kimi-k3.1-pro", "kimi-k3"


def sdk(server: LiveServer, key: str | None = None) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key=key or server.key, max_retries=0, timeout=180)


REREAD = 3  # tokens of "<|im_start|>assistant\n" that the next identical prompt evaluates again


def fully_cached(usage: dict[str, int]) -> bool:
    """All of the prompt was read from the cache but what llama.cpp evaluates again: its last
    token, or the assistant turn's opening where the request's answer phase ran."""
    return usage["prompt"] - REREAD <= usage["cached"] <= usage["prompt"] - 1


def conversation(topic: str | None = None) -> list[dict[str, Any]]:
    """A prompt no other test sends, so no earlier request has cached it."""
    tag = topic or uuid.uuid4().hex
    return [
        {"role": "system", "content": f"You are a terse assistant for project {tag}."},
        {"role": "user", "content": "Name one colour of the rainbow."},
    ]


def ask(
    server: LiveServer,
    messages: list[dict[str, Any]],
    *,
    key: str | None = None,
    model: str = K31,
    stream: bool = False,
    **extra: Any,
) -> tuple[dict[str, int], dict[str, Any]]:
    """One request; returns its usage (flattened) and the assistant message."""
    client = sdk(server, key)
    args: dict[str, Any] = {
        "model": model,
        "messages": messages,
        # kimi-k3 accepts only its default effort; the output cap keeps its reasoning short.
        **({} if model == K3 else {"reasoning_effort": "low"}),
        "max_completion_tokens": 16,
        **extra,
    }
    if not stream:
        resp = client.chat.completions.create(**args)
        message = resp.choices[0].message.model_dump()
        assert resp.usage is not None
        return flat(resp.usage.model_dump()), message
    usage: dict[str, int] | None = None
    content: list[str] = []
    reasoning: list[str] = []
    for chunk in client.chat.completions.create(**args, stream=True, stream_options={"include_usage": True}):
        if chunk.usage is not None:
            usage = flat(chunk.usage.model_dump())
        for choice in chunk.choices:
            extra_fields = choice.delta.model_extra or {}
            reasoning.append(extra_fields.get("reasoning_content") or "")
            content.append(choice.delta.content or "")
    assert usage is not None
    return usage, {"content": "".join(content), "reasoning_content": "".join(reasoning)}


def flat(usage: dict[str, Any]) -> dict[str, int]:
    details = usage["prompt_tokens_details"]
    return {
        "prompt": usage["prompt_tokens"],
        "cached": details["cached_tokens"],
        "write": details["cache_write_tokens"],
    }


def assert_k31_split(usage: dict[str, int]) -> None:
    """K3.1: prompt = regular + cached + cache_write; with the cache on, nothing is regular."""
    regular = usage["prompt"] - usage["cached"] - usage["write"]
    assert regular == 0, usage


def test_second_identical_request_reads_what_the_first_wrote(live_server: LiveServer) -> None:
    messages = conversation()
    first, _ = ask(live_server, messages)
    assert first["cached"] == 0
    assert first["write"] == first["prompt"] > 0
    second, _ = ask(live_server, messages)
    assert second["prompt"] == first["prompt"]
    assert fully_cached(second)  # all but the assistant turn's opening
    assert second["write"] == second["prompt"] - second["cached"]
    assert_k31_split(second)


def test_another_key_never_reads_this_keys_cache(live_server: LiveServer) -> None:
    messages = conversation()
    ask(live_server, messages)
    other, _ = ask(live_server, messages, key=live_server.other_key)
    assert other["cached"] == 0
    assert other["write"] == other["prompt"]
    # Its own write does not displace the first key's entry, and it can read its own.
    again, _ = ask(live_server, messages)
    assert fully_cached(again)
    other_again, _ = ask(live_server, messages, key=live_server.other_key)
    assert fully_cached(other_again)


def test_streaming_reports_the_same_accounting(live_server: LiveServer) -> None:
    messages = conversation()
    first, _ = ask(live_server, messages, stream=True)
    assert (first["cached"], first["write"]) == (0, first["prompt"])
    second, _ = ask(live_server, messages, stream=True)
    assert fully_cached(second) and second["write"] == second["prompt"] - second["cached"]
    plain, _ = ask(live_server, messages)
    # The same counts, but for whether the previous request's answer phase ran (fully_cached).
    assert plain["prompt"] == second["prompt"] and fully_cached(plain)
    assert plain["write"] == plain["prompt"] - plain["cached"]


def test_multi_turn_reuses_the_history(live_server: LiveServer) -> None:
    messages = conversation()
    first, reply = ask(live_server, messages)
    history = [
        *messages,
        {
            "role": "assistant",
            "content": reply["content"],
            "reasoning_content": reply.get("reasoning_content") or "",
        },
        {"role": "user", "content": "And another one?"},
    ]
    second, _ = ask(live_server, history)
    assert second["prompt"] > first["prompt"]
    # The whole first conversation came from the cache; only the new turn was computed. (The
    # slot ends holding the answer's prompt, where the draft's system turn follows the
    # conversation: the first prompt's "assistant\n" opening is the part not reused.)
    assert second["cached"] >= first["prompt"] - 3
    assert second["write"] == second["prompt"] - second["cached"]
    assert_k31_split(second)


def test_kimi_k3_rejects_cache_options_and_bills_writes_as_input(live_server: LiveServer) -> None:
    messages = conversation()
    with pytest.raises(openai.BadRequestError) as err:
        ask(live_server, messages, model=K3, extra_body={"prompt_cache_options": {"ttl": "1h"}})
    assert "prompt_cache_options" in str(err.value)
    first, _ = ask(live_server, messages, model=K3)
    assert (first["cached"], first["write"]) == (0, 0)  # the write is regular input on kimi-k3
    second, _ = ask(live_server, messages, model=K3)
    assert fully_cached(second)
    assert second["write"] == 0


def test_a_prefix_written_under_one_model_id_is_not_read_under_another(live_server: LiveServer) -> None:
    """One engine serves every id here; each id still keeps (and bills) its own cache."""
    messages = conversation()
    written, _ = ask(live_server, messages)
    assert written["write"] == written["prompt"] > 0
    other, _ = ask(live_server, messages, model=K3)
    assert other["cached"] == 0
    again, _ = ask(live_server, messages, model=K3)
    assert fully_cached(again)


def test_stats_endpoint_needs_a_key_and_shows_only_the_callers_namespace(
    live_server: LiveServer,
) -> None:
    url = live_server.base_url + "/cache/stats"
    assert httpx.get(url, timeout=10).status_code == 401
    before = httpx.get(url, headers=auth(live_server.other_key), timeout=10).json()
    messages = conversation()
    ask(live_server, messages)
    ask(live_server, messages)
    mine = httpx.get(url, headers=auth(live_server.key), timeout=10).json()
    theirs = httpx.get(url, headers=auth(live_server.other_key), timeout=10).json()
    assert mine["namespace"]["hits"] >= 1
    assert mine["namespace"]["tokens_held"] > 0
    assert mine["namespace"]["bytes_held"] > 0
    assert "server" not in mine  # no server-wide totals: they move with other keys' traffic
    assert theirs["namespace"]["requests"] == before["namespace"]["requests"]
    assert theirs["namespace"]["id"] != mine["namespace"]["id"]


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def fast_ttl_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """TTLs at 1/100: 5m lasts 3 s and 1h lasts 36 s."""
    proc, server = start_server(tmp_path_factory.mktemp("ttl"), env={"KIMI_CACHE_TTL_SCALE": "0.01"})
    try:
        yield server
    finally:
        stop_server(proc)


def test_an_expired_prefix_is_written_again(fast_ttl_server: LiveServer) -> None:
    five = conversation()
    ask(fast_ttl_server, five)
    hit, _ = ask(fast_ttl_server, five)  # read within milliseconds of the write's end
    assert fully_cached(hit)
    hour = conversation()
    ask(fast_ttl_server, hour, extra_body={"prompt_cache_options": {"ttl": "1h"}})
    time.sleep(3.5)
    miss, _ = ask(fast_ttl_server, five)
    assert miss["cached"] == 0
    assert miss["write"] == miss["prompt"]
    # The 1h entry outlives the 5m one (one request and 3.5 s later, well inside its 36 s).
    still, _ = ask(fast_ttl_server, hour)
    assert fully_cached(still)
    stats = httpx.get(fast_ttl_server.base_url + "/cache/stats", headers=auth(fast_ttl_server.key), timeout=10).json()
    assert stats["namespace"]["expirations"] >= 1


BOUND = 200  # tokens: room for two of these small conversations (prompt ~60, draft turn and output <= ~70)


PARTNER = "sk-team-partner"  # shares the test key's namespace on the bounded server


@pytest.fixture(scope="module")
def bounded_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    env = {
        "KIMI_CACHE_MAX_TOKENS": str(BOUND),
        "KIMI_CACHE_GROUPS": json.dumps({"team": [TEST_KEY, PARTNER]}),
    }
    proc, server = start_server(tmp_path_factory.mktemp("bound"), "--api-key", PARTNER, env=env)
    try:
        yield server
    finally:
        stop_server(proc)


def test_entries_beyond_the_token_bound_are_evicted_lru_and_then_miss(
    bounded_server: LiveServer,
) -> None:
    prompts = [conversation() for _ in range(5)]
    for messages in prompts:
        ask(bounded_server, messages)
    stats = httpx.get(bounded_server.base_url + "/cache/stats", headers=auth(bounded_server.key), timeout=10).json()
    assert stats["namespace"]["evictions"] >= 2
    assert stats["namespace"]["expirations"] == 0
    assert 0 < stats["namespace"]["tokens_held"] <= BOUND == stats["max_tokens"]
    # The oldest was evicted before its TTL: honestly a miss, written again.
    oldest, _ = ask(bounded_server, prompts[0])
    assert (oldest["cached"], oldest["write"]) == (0, oldest["prompt"])
    newest, _ = ask(bounded_server, prompts[-1])
    assert fully_cached(newest)


def test_keys_an_operator_grouped_share_a_namespace(bounded_server: LiveServer) -> None:
    messages = conversation()
    ask(bounded_server, messages)
    partner, _ = ask(bounded_server, messages, key=PARTNER)
    assert fully_cached(partner)
    outsider, _ = ask(bounded_server, messages, key=bounded_server.other_key)
    assert outsider["cached"] == 0


OPENING = 10  # tokens of "<|im_start|>system\nYou are a terse assistant for project "


def responses_usage(server: LiveServer, messages: list[dict[str, Any]], **extra: Any) -> dict[str, int]:
    """The same conversation through the Responses endpoint; its usage, flattened."""
    resp = sdk(server).responses.create(
        model=K31,
        instructions=messages[0]["content"],
        input=messages[1]["content"],
        reasoning={"effort": "low"},
        max_output_tokens=16,
        **extra,
    )
    assert resp.usage is not None
    usage = resp.usage.model_dump()
    details = usage["input_tokens_details"]
    return {
        "prompt": usage["input_tokens"],
        "cached": details["cached_tokens"],
        "write": details["cache_write_tokens"],
    }


def test_responses_and_chat_share_one_cache_and_one_accounting(live_server: LiveServer) -> None:
    messages = conversation()
    chat, _ = ask(live_server, messages)
    # New text: at most the system turn's opening words (every conversation() starts with them)
    # are read from what this key left in the slot; everything else is written.
    assert chat["cached"] <= OPENING and chat["write"] == chat["prompt"] - chat["cached"]
    # The same conversation rendered the same way: the Responses request reads what Chat wrote.
    resp = responses_usage(live_server, messages)
    assert resp["prompt"] == chat["prompt"]
    assert fully_cached(resp) and resp["write"] == resp["prompt"] - resp["cached"]
    fresh = responses_usage(live_server, conversation())
    assert fresh["cached"] <= OPENING and fresh["write"] == fresh["prompt"] - fresh["cached"]
