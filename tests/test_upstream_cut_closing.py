"""An upstream's structured answer or call cut by the output cap reaches the client closed to a
valid value, as the embedded engine's does: the answer still says ``length``, and text the
upstream sent that is not the start of a JSON value is left as it came."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tests.upstreams.fake import Conn, FakeUpstream, chunk
from tests.upstreams.front import config, front

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOL: Any = {"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}}
MESSAGES: Any = [{"role": "user", "content": "Weather in Paris for 3 days, as JSON."}]


def cut_at_the_cap(pieces: tuple[str, ...]) -> Any:
    async def handler(body: dict[str, Any], c: Conn) -> None:
        await c.head()
        await c.event(chunk({"role": "assistant", "content": ""}))
        await c.event(chunk({"reasoning_content": "Think."}))
        if body.get("tools"):
            call = {
                "id": "call-1",
                "type": "function",
                "index": 0,
                "function": {"name": "get_weather", "arguments": ""},
            }
            await c.event(chunk({"tool_calls": [call]}))
            for piece in pieces:
                await c.event(chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}))
        else:
            for piece in pieces:
                await c.event(chunk({"content": piece}))
        await c.event(chunk({}, "length"))
        usage = {"prompt_tokens": 20, "completion_tokens": 8, "total_tokens": 28}
        await c.event({**chunk({}), "choices": [], "usage": usage})
        await c.done()

    return handler


STRUCTURED = {"type": "json_schema", "json_schema": {"name": "weather", "schema": SCHEMA, "strict": True}}


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_structured_answer_cut_by_the_cap_is_closed_valid(tmp_path: Path, stream: bool) -> None:
    with FakeUpstream(cut_at_the_cap(('{"city": ', '"Par'))) as up, front(tmp_path, config(up.url)) as f:
        content, finish = ask(f, stream, response_format=STRUCTURED)
    assert finish == "length"
    assert content.startswith('{"city": "Par')  # what the upstream said, then the closing
    jsonschema.validate(json.loads(content), SCHEMA)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_call_cut_by_the_cap_has_whole_arguments(tmp_path: Path, stream: bool) -> None:
    with FakeUpstream(cut_at_the_cap(('{"city": "Paris", "da',))) as up, front(tmp_path, config(up.url)) as f:
        if stream:
            arguments = ""
            finish = None
            for event in f.sdk.chat.completions.create(
                model="kimi-k3.1-pro", messages=MESSAGES, tools=[TOOL], tool_choice="required", stream=True
            ):
                for choice in event.choices:
                    for call in choice.delta.tool_calls or []:
                        arguments += call.function.arguments or "" if call.function else ""
                    finish = choice.finish_reason or finish
        else:
            resp = f.sdk.chat.completions.create(
                model="kimi-k3.1-pro", messages=MESSAGES, tools=[TOOL], tool_choice="required"
            )
            calls = resp.choices[0].message.tool_calls or []
            assert len(calls) == 1 and calls[0].type == "function"
            assert calls[0].function.name == "get_weather"
            arguments, finish = calls[0].function.arguments, resp.choices[0].finish_reason
    assert finish == "length"
    assert arguments.startswith('{"city": "Paris", "da')
    jsonschema.validate(json.loads(arguments), SCHEMA)


def test_text_that_is_not_json_is_left_as_it_came(tmp_path: Path) -> None:
    with FakeUpstream(cut_at_the_cap(("```json\n", '{"city": "Par'))) as up, front(tmp_path, config(up.url)) as f:
        content, finish = ask(f, False, response_format=STRUCTURED)
        assert (content, finish) == ('```json\n{"city": "Par', "length")
        content, finish = ask(f, False)  # free text is never closed
        assert (content, finish) == ('```json\n{"city": "Par', "length")


def ask(f: Any, stream: bool, **extra: Any) -> tuple[str, str | None]:
    if not stream:
        resp = f.sdk.chat.completions.create(model="kimi-k3.1-pro", messages=MESSAGES, **extra)
        return resp.choices[0].message.content or "", resp.choices[0].finish_reason
    content, finish = "", None
    for event in f.sdk.chat.completions.create(model="kimi-k3.1-pro", messages=MESSAGES, stream=True, **extra):
        for choice in event.choices:
            content += choice.delta.content or ""
            finish = choice.finish_reason or finish
    return content, finish
