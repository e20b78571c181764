"""Attempts decoded together on the real server: after its first attempt, a request's reasoning
runs on a lent slot too, and a second request that needs that slot gets it back; both are
answered and billed."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.conftest import DEFAULT_MODEL, start_server, stop_server

pytestmark = pytest.mark.e2e


def test_a_request_that_needs_a_lent_slot_gets_it_back(tmp_path: Path) -> None:
    # Two slots: the first request decodes its attempts on both, the second needs one of them.
    proc, server = start_server(tmp_path, "--model", DEFAULT_MODEL, "--parallel", "2", env={"KIMI_CACHE_ENTRIES": "2"})
    try:
        client = openai.OpenAI(base_url=server.base_url, api_key=server.key, max_retries=0, timeout=300)
        first_reasoning: list[str] = []
        started = threading.Event()
        results: dict[str, Any] = {}

        def first() -> None:
            stream = client.chat.completions.create(
                model="kimi-k3.1-pro",
                messages=[{"role": "user", "content": "Name three colours."}],
                reasoning_effort="max",
                stream=True,
                stream_options={"include_usage": True},
            )
            for chunk in stream:
                if chunk.usage is not None:
                    results["first_usage"] = chunk.usage
                if chunk.choices and (text := (chunk.choices[0].delta.model_extra or {}).get("reasoning_content")):
                    first_reasoning.append(text)
                    # The first attempt runs alone; from the second round on a slot is lent.
                    if "Attempt 2:" in "".join(first_reasoning):
                        started.set()

        thread = threading.Thread(target=first)
        thread.start()
        assert started.wait(120)
        second = client.chat.completions.create(
            model="kimi-k3.1-pro", messages=[{"role": "user", "content": "Say hi."}], reasoning_effort="low"
        )
        thread.join(300)
        assert not thread.is_alive()
        assert second.choices[0].message.content and second.usage is not None
        usage = results["first_usage"]
        reasoning = "".join(first_reasoning)
        # The first request's floor (72 in the test budgets) still holds, its attempts in order.
        assert usage.completion_tokens_details.reasoning_tokens >= 72
        assert "Attempt 2:" in reasoning and "Going with attempt" in reasoning
        log = server.log.read_text()
        assert "lent slot" in log and "asked back for another request" in log
    finally:
        stop_server(proc)
