"""An answer the repetition guard stopped says so beside its "length" ending, in a field the
official SDKs keep (``stopped_by``), while the reason fields keep the values they know: Chat's
choice (whole and its last chunk), Responses' ``incomplete_details``, the Messages ``Message``
and its ``message_delta``. An answer the output cap cut has no such field."""

from __future__ import annotations

from typing import Any

import anthropic
import pytest
from anthropic.types import MessageParam
from fastapi.testclient import TestClient
from openai import OpenAI
from openai.types.chat import ChatCompletionMessageParam

from kimi_server.engines.scripted import Script, ScriptedEngine
from tests.conftest import TEST_KEY

ASK: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Count."}]
ASK_MESSAGES: list[MessageParam] = [{"role": "user", "content": "Count."}]
MODEL = "kimi-k3.1-pro"
CAP = 5  # two reasoning tokens, then three of the twenty the answer has


def endings(client: TestClient) -> dict[str, tuple[str | None, str | None]]:
    """Per door, whole and streamed: its reason field, and its ``stopped_by``."""
    sdk = OpenAI(base_url="http://testserver/v1", api_key=TEST_KEY, http_client=client, max_retries=0)
    chat = sdk.chat.completions.create(model=MODEL, messages=ASK, max_completion_tokens=CAP)
    chunks = sdk.chat.completions.create(model=MODEL, messages=ASK, max_completion_tokens=CAP, stream=True)
    last = next(c.choices[0] for c in chunks if c.choices and c.choices[0].finish_reason)
    resp = sdk.responses.create(model=MODEL, input="Count.", max_output_tokens=CAP)
    events = sdk.responses.create(model=MODEL, input="Count.", max_output_tokens=CAP, stream=True)
    streamed = next(e.response for e in events if e.type == "response.incomplete")
    assert resp.incomplete_details is not None and streamed.incomplete_details is not None
    msgs = anthropic.Anthropic(base_url="http://testserver", api_key=TEST_KEY, http_client=client, max_retries=0)
    message = msgs.messages.create(model=MODEL, max_tokens=CAP, messages=ASK_MESSAGES)
    with msgs.messages.stream(model=MODEL, max_tokens=CAP, messages=ASK_MESSAGES) as stream:
        delta = next(e.delta for e in stream if e.type == "message_delta")
    return {
        "chat": (chat.choices[0].finish_reason, extra(chat.choices[0])),
        "chat chunk": (last.finish_reason, extra(last)),
        "responses": (resp.incomplete_details.reason, extra(resp.incomplete_details)),
        "responses streamed": (streamed.incomplete_details.reason, extra(streamed.incomplete_details)),
        "messages": (message.stop_reason, extra(message)),
        "messages delta": (delta.stop_reason, extra(delta)),
    }


def extra(model: Any) -> str | None:
    return (model.model_extra or {}).get("stopped_by")


@pytest.mark.parametrize("looped", [True, False], ids=["repetition-guard", "output-cap"])
def test_a_length_ending_says_whether_the_repetition_guard_caused_it(
    client: TestClient, engine: ScriptedEngine, looped: bool
) -> None:
    engine.script = Script(content=("one ",) * 20, looped=looped)
    said = "repetition_guard" if looped else None
    cap = {"chat": "length", "responses": "max_output_tokens", "messages": "max_tokens"}
    for door, (reason, stopped_by) in endings(client).items():
        assert reason == cap[door.split()[0]], door
        assert stopped_by == said, door
