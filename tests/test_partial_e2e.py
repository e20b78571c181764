"""Partial Mode end to end: the real server, the real tiny model (smollm2-135m) and the
official openai SDK. The answer continues the client's prefix: its content is only the
continuation, streamed or not, and under ``json_object`` prefix plus content is one JSON
object whatever the prefix stopped inside."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import openai
import pytest

from tests.conftest import LiveServer

pytestmark = pytest.mark.e2e

COMMON: dict[str, Any] = {"model": "kimi-k3.1-pro", "reasoning_effort": "low", "max_completion_tokens": 160}
ASK = {"role": "user", "content": "Describe a cat as a JSON object with its name and age."}


@pytest.fixture(scope="module")
def sdk(live_server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=live_server.base_url, api_key=live_server.key, max_retries=0, timeout=600)


def answer(sdk: openai.OpenAI, messages: list[Any], *, stream: bool, **fields: Any) -> tuple[str, str, str]:
    """(content, reasoning, finish_reason)."""
    if not stream:
        r = sdk.chat.completions.create(**COMMON, messages=messages, **fields)
        msg = r.choices[0].message
        return (
            msg.content or "",
            (msg.model_extra or {}).get("reasoning_content") or "",
            str(r.choices[0].finish_reason),
        )
    content, reasoning, finish = "", "", ""
    for chunk in sdk.chat.completions.create(**COMMON, messages=messages, stream=True, **fields):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            reasoning += (choice.delta.model_extra or {}).get("reasoning_content") or ""
            finish = choice.finish_reason or finish
    return content, reasoning, finish


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("prefix", ["{", '{"name": "', '{"name": "Tom", "age": 4', '{"alive": tr'])
def test_a_json_prefix_is_continued_into_one_object(sdk: openai.OpenAI, prefix: str, stream: bool) -> None:
    messages = [ASK, {"role": "assistant", "content": prefix, "partial": True}]
    content, reasoning, finish = answer(sdk, messages, stream=stream, response_format={"type": "json_object"})
    # The tiny model may loop inside the object until the repetition guard or the cap cuts it:
    # a cut answer is closed, so prefix plus content is one object either way.
    assert finish in ("stop", "length") and reasoning  # the reasoning still comes first
    assert not content.startswith(prefix)
    value = json.loads(prefix + content)
    assert isinstance(value, dict)
    if prefix.startswith('{"name": "Tom"'):
        assert value["name"] == "Tom"


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_role_play_prefix_is_continued_not_repeated(sdk: openai.OpenAI, stream: bool) -> None:
    prefix = "My dear Watson, the culprit"
    messages = [
        {"role": "system", "content": "You are Sherlock Holmes."},
        {"role": "user", "content": "Who did it?"},
        {"role": "assistant", "name": "Sherlock Holmes", "content": prefix, "partial": True},
    ]
    content, reasoning, _ = answer(sdk, messages, stream=stream)
    assert content.strip() and reasoning
    assert not content.lstrip().startswith(prefix)
    assert not content.lstrip().startswith("Sherlock Holmes:")


def test_a_json_schema_prefix_opens_the_object(sdk: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "cat", "strict": True, "schema": schema}}
    messages = [ASK, {"role": "assistant", "content": "{", "partial": True}]
    content, _, finish = answer(sdk, messages, stream=True, response_format=fmt)
    assert finish == "stop" and not content.startswith("{")
    value = json.loads("{" + content)
    assert set(value) == {"name", "age"} and isinstance(value["age"], int)


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        ([{"role": "assistant", "content": "Hi", "partial": True}, ASK], "messages[0].partial"),
        ([{**ASK, "partial": True}], "messages[0].partial"),
    ],
)
def test_misplaced_partial_is_a_400(sdk: openai.OpenAI, messages: list[Any], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.chat.completions.create(**COMMON, messages=messages)
    body: Any = caught.value.body
    assert body["param"] == param and "partial" in body["message"]


def test_a_prefix_that_no_object_begins_with_is_a_400(sdk: openai.OpenAI) -> None:
    messages: list[Any] = [ASK, {"role": "assistant", "content": "Sure thing", "partial": True}]
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.chat.completions.create(**COMMON, messages=messages, response_format={"type": "json_object"})
    body: Any = caught.value.body
    assert body["param"] == "messages[1].partial"


def test_an_anthropic_prefill_is_continued_not_repeated(live_server: LiveServer) -> None:
    """The Messages door's prefill is the same prefix: the text block holds only the rest."""
    client = anthropic.Anthropic(
        base_url=live_server.base_url.removesuffix("/v1"), api_key=live_server.key, max_retries=0, timeout=600
    )
    prefix = "The three primary colours are"
    message = client.messages.create(
        model="kimi-k3.1-pro",
        max_tokens=160,
        messages=[{"role": "user", "content": "Name the primary colours."}, {"role": "assistant", "content": prefix}],
    )
    text = "".join(block.text for block in message.content if block.type == "text")
    assert text.strip() and not text.lstrip().startswith(prefix)
