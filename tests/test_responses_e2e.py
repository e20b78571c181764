"""End to end: the real server with the real tiny model (llama.cpp), driven by the official
openai SDK, unchanged."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from openai import OpenAI
from openai.types.responses import EasyInputMessageParam

from tests.conftest import LiveServer

pytestmark = pytest.mark.e2e
MODEL = "kimi-k3.1-pro"
LOW: Any = {"effort": "low"}
QUESTION = "What is the capital of France? Answer in one short sentence."


@pytest.fixture(scope="module")
def sdk(live_server: LiveServer) -> OpenAI:
    return OpenAI(base_url=live_server.base_url, api_key=live_server.key, max_retries=0)


def test_create_plain(sdk: OpenAI) -> None:
    r = sdk.responses.create(model=MODEL, input=QUESTION, reasoning=LOW, max_output_tokens=96)
    assert r.status in ("completed", "incomplete")
    assert r.output_text.strip()
    reasoning = r.output[0]
    assert reasoning.type == "reasoning" and reasoning.encrypted_content
    assert reasoning.summary and reasoning.summary[0].text
    assert r.usage is not None and r.usage.output_tokens_details.reasoning_tokens > 0
    assert (r.model_extra or {})["store"] is False and r.previous_response_id is None


def test_create_stream(sdk: OpenAI) -> None:
    events = list(sdk.responses.create(model=MODEL, input=QUESTION, reasoning=LOW, max_output_tokens=96, stream=True))
    numbers = [e.sequence_number for e in events]
    assert numbers == sorted(set(numbers))
    assert events[0].type == "response.created" and events[1].type == "response.in_progress"
    final = events[-1]
    assert final.type in ("response.completed", "response.incomplete")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text.strip() and text == final.response.output_text


def test_stream_helper_final_response(sdk: OpenAI) -> None:
    # Room enough that the answer ends by itself: the helper's final response is "completed".
    with sdk.responses.stream(model=MODEL, input=QUESTION, reasoning=LOW, max_output_tokens=256) as stream:
        final = stream.get_final_response()
    assert final.status == "completed"
    assert final.output_text.strip()


def test_reasoning_round_trip_reaches_the_prompt(sdk: OpenAI) -> None:
    first = sdk.responses.create(model=MODEL, input=QUESTION, reasoning=LOW, max_output_tokens=96)
    assert first.usage is not None
    reasoning_tokens = first.usage.output_tokens_details.reasoning_tokens
    message = [o for o in first.output if o.type == "message"]
    follow_up: EasyInputMessageParam = {"role": "user", "content": "And of Italy?"}
    user: EasyInputMessageParam = {"role": "user", "content": QUESTION}
    # The SDK takes its own output items back as input, which its parameter types do not say.
    items: list[Any] = [user, *first.output, follow_up]
    with_reasoning = sdk.responses.create(model=MODEL, input=items, reasoning=LOW, max_output_tokens=16)
    items = [user, *message, follow_up]
    without = sdk.responses.create(model=MODEL, input=items, reasoning=LOW, max_output_tokens=16)
    assert with_reasoning.usage is not None and without.usage is not None
    grown = with_reasoning.usage.input_tokens - without.usage.input_tokens
    # The restored reasoning is re-tokenised inside its markers: about as long as it was.
    assert 0.5 * reasoning_tokens <= grown <= reasoning_tokens + 16, (grown, reasoning_tokens)

    reasoning = first.output[0]
    assert reasoning.type == "reasoning" and reasoning.encrypted_content
    blob = reasoning.encrypted_content
    i = len(blob) // 2
    altered = blob[:i] + ("A" if blob[i] != "A" else "B") + blob[i + 1 :]
    tampered: Any = {**reasoning.model_dump(exclude_none=True), "encrypted_content": altered}
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.responses.create(model=MODEL, input=[user, tampered, follow_up], reasoning=LOW, max_output_tokens=16)
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["param"] == "input[1].encrypted_content"
