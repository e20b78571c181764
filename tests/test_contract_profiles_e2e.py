"""End to end: a real server started with ``--contract moonshot`` (one route kept on the
evolink reference), the real tiny model through llama.cpp, the official openai SDK."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import LiveServer, start_server, stop_server

pytestmark = pytest.mark.e2e

PROMPT: Any = [{"role": "user", "content": "Name three colours."}]
OFF = {"thinking": {"type": "disabled"}}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    routes = json.dumps({"kimi-k3.1-pro-highspeed": {"contract": "evolink"}})
    proc, live = start_server(
        tmp_path_factory.mktemp("moonshot"), "--contract", "moonshot", env={"KIMI_ROUTES": routes}
    )
    try:
        yield live
    finally:
        stop_server(proc)


def sdk(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key=server.key, max_retries=0, timeout=600)


def test_models_name_each_profile(server: LiveServer) -> None:
    models = {m.id: (m.model_extra or {})["contract"] for m in sdk(server).models.list()}
    assert models == {"kimi-k3.1-pro": "moonshot", "kimi-k3.1-pro-highspeed": "evolink", "kimi-k3": "moonshot"}


def test_thinking_disabled_answers_without_reasoning(server: LiveServer) -> None:
    resp = sdk(server).chat.completions.create(
        model="kimi-k3.1-pro", messages=PROMPT, max_completion_tokens=60, extra_body=OFF
    )
    message = resp.choices[0].message
    assert "reasoning_content" not in (message.model_extra or {})
    assert message.content and message.content.strip()
    usage = resp.usage
    assert usage is not None and usage.completion_tokens_details is not None
    assert usage.completion_tokens_details.reasoning_tokens == 0
    assert 0 < usage.completion_tokens <= 60


def test_thinking_disabled_stream_on_responses(server: LiveServer) -> None:
    stream = sdk(server).responses.create(
        model="kimi-k3", input="Name three colours.", max_output_tokens=60, extra_body=OFF, stream=True
    )
    events = list(stream)
    kinds = [event.type for event in events]
    # An answer cut by the cap ends with response.incomplete instead: both carry the response.
    last = events[-1]
    assert last.type in ("response.completed", "response.incomplete"), kinds
    final = last.response
    assert not [k for k in kinds if "reasoning" in k]
    assert [item.type for item in final.output] == ["message"]
    assert final.output_text.strip()
    assert final.temperature == 0.6


def test_evolink_route_keeps_reasoning(server: LiveServer) -> None:
    resp = sdk(server).chat.completions.create(
        model="kimi-k3.1-pro-highspeed",
        messages=PROMPT,
        reasoning_effort="low",
        max_completion_tokens=200,
        extra_body=OFF,
    )
    assert (resp.choices[0].message.model_extra or {})["reasoning_content"].strip()
    usage = resp.usage
    assert usage is not None and usage.completion_tokens_details is not None
    assert (usage.completion_tokens_details.reasoning_tokens or 0) > 0


def test_fixed_penalty_is_refused_through_the_sdk(server: LiveServer) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        sdk(server).chat.completions.create(model="kimi-k3", messages=PROMPT, presence_penalty=0.5)
    assert isinstance(caught.value.body, dict) and caught.value.body["param"] == "presence_penalty"


def test_auto_tool_choice_without_tools_is_answered(server: LiveServer) -> None:
    """``tool_choice: "auto"`` and no ``tools`` field at all: a plain answer, no calls."""
    body = {"model": "kimi-k3", "messages": PROMPT, "tool_choice": "auto", "max_tokens": 40, **OFF}
    resp = httpx.post(
        f"{server.base_url}/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {server.key}"},
        timeout=600,
    )
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    assert choice["finish_reason"] in ("stop", "length")
    assert choice["message"]["content"].strip() and "tool_calls" not in choice["message"]
