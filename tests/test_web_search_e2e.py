"""The full ``$web_search`` loop with the default model (qwen2.5-coder-0.5b) and a local index,
through the ``openai`` SDK: Chat Completions (call, echo, answer from the indexed text) and
Responses (web_search_call items with sources, streamed and not, schema-valid). One server.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import LiveServer, start_server, stop_server
from tests.responses_util import parse_sse
from tests.test_web_search_schema import check_search_event, check_search_response

pytestmark = pytest.mark.e2e

DOC = """# Zorblax harbour

The Zorblax harbour lighthouse was painted teal in 2024. Its keeper is named Ilsa Brandt.
"""
OTHER = """# Apple orchards

Apple orchards in the valley bloom in April and are harvested in September.
"""
KB = "https://kb.example.org/docs/"  # the URL the operator gives the indexed directory
QUESTION = "Search the web for the Zorblax harbour lighthouse: what colour is it painted?"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    tmp = tmp_path_factory.mktemp("websearch")
    docs = tmp / "docs"
    docs.mkdir()
    (docs / "zorblax.md").write_text(DOC)
    (docs / "apples.md").write_text(OTHER)
    index = tmp / "index.sqlite3"
    proc, live = start_server(tmp, "--model", "qwen2.5-coder-0.5b", env={"KIMI_WEB_SEARCH_INDEX": str(index)})
    try:
        # Indexed while the server runs: searchable at once.
        subprocess.run(
            [sys.executable, "-m", "kimi_server.cli", "search", "index", str(docs), "--url", KB, "--index", str(index)],
            check=True,
            capture_output=True,
        )
        yield live
    finally:
        stop_server(proc)


def sdk(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key=server.key, max_retries=0, timeout=900)


def test_chat_loop_searches_then_answers(server: LiveServer) -> None:
    client = sdk(server)
    messages: list[Any] = [{"role": "user", "content": QUESTION}]
    common: dict[str, Any] = {
        "model": "kimi-k3.1-pro",
        "reasoning_effort": "low",
        "max_completion_tokens": 96,
        "seed": 7,
        "tools": [{"type": "web_search"}],
    }
    first = client.chat.completions.create(messages=messages, **common)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls, choice.message
    call = choice.message.tool_calls[0]
    # The SDK's models know no "builtin_function" call type (a Kimi one): dumped without
    # pydantic's warning that the value is not one of the types it expects.
    raw = call.model_dump(warnings=False)
    assert raw["type"] == "builtin_function" and raw["function"]["name"] == "$web_search"
    arguments = raw["function"]["arguments"]
    assert "zorblax" in json.loads(arguments)["query"].lower()
    messages.append(choice.message.model_dump(exclude_none=True, warnings=False))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": arguments})
    # The server runs the search and the model answers: a sampled answer, so only its shape is
    # asserted. That the indexed text reaches the prompt is tests/test_web_search_schema.py's;
    # how well a small model answers from it is benchmarks/answer_quality.py's.
    second = client.chat.completions.create(messages=messages, **{**common, "max_completion_tokens": 160})
    answered = second.choices[0]
    assert answered.finish_reason in ("stop", "length") and not answered.message.tool_calls
    assert answered.message.content


def test_responses_search_items_with_sources(server: LiveServer) -> None:
    fields: dict[str, Any] = {
        "model": "kimi-k3.1-pro",
        "input": QUESTION,
        "reasoning": {"effort": "low"},
        "max_output_tokens": 256,
        "tools": [{"type": "web_search"}],
        "include": ["web_search_call.action.sources", "web_search_call.results"],
    }
    raw = sdk(server).responses.with_raw_response.create(**fields)
    data = json.loads(raw.http_response.text)  # validated as sent, not as the SDK re-serializes it
    check_search_response(data)
    parsed = raw.parse()
    assert parsed.output[0].type == "web_search_call"  # the SDK reads the item
    kinds = [o["type"] for o in data["output"]]
    assert kinds[0] == "web_search_call" and "message" in kinds, kinds
    sources = data["output"][0]["action"]["sources"]
    assert KB + "zorblax.md" in [s["url"] for s in sources], sources
    assert "file:" not in raw.http_response.text and "/docs/zorblax.md" in raw.http_response.text
    assert data["status"] in ("completed", "incomplete")  # sampled: the answer's length varies
    assert data["usage"]["output_tokens"] <= 256  # the budget bounds every round together

    headers = {"Authorization": f"Bearer {server.key}"}
    s = httpx.post(f"{server.base_url}/responses", json={**fields, "stream": True}, headers=headers, timeout=900)
    events = parse_sse(s.text)
    for e in events:
        check_search_event(e)
    types = [e["type"] for e in events]
    assert types[2:6] == [
        "response.output_item.added",
        "response.web_search_call.in_progress",
        "response.web_search_call.searching",
        "response.web_search_call.completed",
    ], types
    final = events[-1]["response"]
    assert final["output"][0]["type"] == "web_search_call"
    # The query is sampled anew (Responses has no seed): it searched, and sources were included.
    assert "sources" in final["output"][0]["action"], final["output"][0]
