"""Partial Mode at the Chat Completions door, against the scripted engine, on both contract
profiles: the partial last message becomes the request's answer prefix (not a turn of the
conversation), and every misplaced or unfit ``partial`` is a 400 naming it."""

from __future__ import annotations

from typing import Any

import pytest

from kimi_server.engines.scripted import ScriptedEngine
from kimi_server.engines.types import AnswerPrefix
from tests.conftest import ScriptedApp
from tests.messages_util import body, plan, refused
from tests.test_chat_contract import URL, assert_error

USER = {"role": "user", "content": "Hi"}
TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}


def partial(content: Any, **extra: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": content, "partial": True, **extra}


@pytest.mark.parametrize("contract", ["evolink", "moonshot"])
def test_the_partial_message_becomes_the_answer_prefix(contract: str, scripted_app: ScriptedApp) -> None:
    engine = ScriptedEngine()
    with scripted_app(engine, contract=contract) as c:
        messages = [USER, partial([{"type": "text", "text": "Dear "}, {"type": "text", "text": "Sir"}], name="Bob")]
        r = c.post(URL, json={"model": "kimi-k3.1-pro", "messages": messages})
        assert r.status_code == 200, r.text
        r = c.post(URL, json={"model": "kimi-k3.1-pro", "messages": [USER, {**partial("x"), "partial": False}]})
        assert r.status_code == 200, r.text
    first, second = engine.requests
    assert first.answer_prefix == AnswerPrefix("Dear Sir", "Bob", "messages[1].partial")
    assert [m.role for m in first.messages] == ["user"]
    assert second.answer_prefix is None and [m.role for m in second.messages] == ["user", "assistant"]


CASES: list[tuple[str, dict[str, Any], str]] = [
    ("not last", {"messages": [partial("x"), USER]}, "messages[0].partial"),
    ("a user message", {"messages": [{**USER, "partial": True}]}, "messages[0].partial"),
    (
        "with tool_calls",
        {
            "messages": [
                USER,
                partial(
                    None, tool_calls=[{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
                ),
            ]
        },
        "messages[1].partial",
    ),
    (
        "a forced call",
        {"messages": [USER, partial("I")], "tools": [TOOL], "tool_choice": "required"},
        "messages[1].partial",
    ),
    (
        "a named call",
        {
            "messages": [USER, partial("I")],
            "tools": [TOOL],
            "tool_choice": {"type": "function", "function": {"name": "lookup"}},
        },
        "messages[1].partial",
    ),
    (
        "text under json_object",
        {"messages": [USER, partial("Sure")], "response_format": {"type": "json_object"}},
        "messages[1].partial",
    ),
    (
        "an array under json_object",
        {"messages": [USER, partial("[")], "response_format": {"type": "json_object"}},
        "messages[1].partial",
    ),
    (
        "a whole object",
        {"messages": [USER, partial('{"a": 1}')], "response_format": {"type": "json_object"}},
        "messages[1].partial",
    ),
    (
        "broken JSON",
        {"messages": [USER, partial('{"a": 01')], "response_format": {"type": "json_object"}},
        "messages[1].partial",
    ),
]


@pytest.mark.parametrize("contract", ["evolink", "moonshot"])
@pytest.mark.parametrize(("case", "fields", "param"), CASES, ids=[c[0] for c in CASES])
def test_misplaced_or_unfit_partial_is_a_400(
    case: str, fields: dict[str, Any], param: str, contract: str, scripted_app: ScriptedApp
) -> None:
    engine = ScriptedEngine()
    with scripted_app(engine, contract=contract) as c:
        err = assert_error(c.post(URL, json={"model": "kimi-k3.1-pro", **fields}), 400, param)
    assert "partial" in err["message"] or "Partial" in err["message"]
    assert engine.requests == []


def test_a_json_prefix_and_auto_tools_are_accepted(scripted_app: ScriptedApp) -> None:
    engine = ScriptedEngine()
    with scripted_app(engine) as c:
        fmt = {"type": "json_object"}
        r = c.post(
            URL, json={"model": "kimi-k3.1-pro", "messages": [USER, partial(' {"a": "x')], "response_format": fmt}
        )
        assert r.status_code == 200, r.text
        r = c.post(URL, json={"model": "kimi-k3.1-pro", "messages": [USER, partial("I")], "tools": [TOOL]})
        assert r.status_code == 200, r.text
    assert [r.answer_prefix.text for r in engine.requests if r.answer_prefix] == [' {"a": "x', "I"]


# -- the Messages door: Anthropic's prefill is the same answer prefix ---------------------------


def test_a_messages_prefill_is_the_answer_prefix() -> None:
    ask = {"role": "user", "content": "Count."}
    gen = plan({**body(), "messages": [ask, {"role": "assistant", "content": "1, 2,"}]}).gen
    assert gen.answer_prefix == AnswerPrefix("1, 2,", None, "messages[1].content")
    assert [m.role for m in gen.messages] == ["user"]
    blocks = [{"type": "text", "text": '{"a": '}, {"type": "text", "text": "1"}]
    fmt = {"format": {"type": "json_schema", "schema": {"type": "object"}}}
    # Under a JSON format the prefix must begin a JSON value (the embedded engine then narrows
    # what it continues); a forced tool call cannot follow a text prefix.
    gen = plan({**body(), "messages": [ask, {"role": "assistant", "content": blocks}], "output_config": fmt}).gen
    assert gen.answer_prefix is not None and gen.answer_prefix.text == '{"a": 1'
    text = {**body(), "messages": [ask, {"role": "assistant", "content": "Sure"}], "output_config": fmt}
    assert refused(text).param == "messages[1].content"
    tools = [{"name": "f", "input_schema": {"type": "object"}}]
    forced = {
        **body(),
        "messages": [ask, {"role": "assistant", "content": "I"}],
        "tools": tools,
        "tool_choice": {"type": "any"},
    }
    assert refused(forced).param == "messages[1].content"
