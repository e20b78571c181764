"""The streamed tool-call parser and the answer plan, without a model.

Conformance: whatever the chunking, the reassembled calls are the same (as vLLM's parser suite
demands of every tool parser)."""

from __future__ import annotations

import itertools
import json
import random
from typing import Any

import pytest

from kimi_server.engines.llamacpp.answer import plan_answer
from kimi_server.engines.llamacpp.decide import (
    decision_grammar,
    decision_prompt,
    last_user_text,
    reasoning_writes_call,
)
from kimi_server.engines.llamacpp.grammar import (
    BARE_SYNTAX,
    MAX_PARALLEL_CALLS,
    QWEN_SYNTAX,
    CallSyntax,
)
from kimi_server.engines.llamacpp.toolcalls import CallStreamParser
from kimi_server.engines.types import (
    GenerationRequest,
    Message,
    OutputFormat,
    ReasoningBudget,
    ToolCallDelta,
    ToolChoice,
    ToolSpec,
)

PATCH = (
    "*** Begin Patch\n*** Update File: src/app.py\n@@ def main():\n-    print('hi')\n"
    "+    print('hello')\n*** Add File: NOTES.md\n+# Notes\n*** End Patch"
)
CALLS = [
    ("get_weather", '{"city": "Paris \\"Ville\\" {Lumi\\u00e8re}", "days": [1, 2]}'),
    ("apply_patch", PATCH),
    ("lookup", '{"q": {"nested": {"deep": []}}, "s": "}]"}'),
]


def render(syntax: CallSyntax, calls: list[tuple[str, str]]) -> str:
    parts = []
    for name, args in calls:
        body = args if name == "apply_patch" else f'{{"name": "{name}", "arguments": {args}}}'
        parts.append(f"{syntax.open}{body}{syntax.close}")
    return syntax.separator.join(parts)


def reassemble(deltas: list[ToolCallDelta]) -> list[tuple[str, str, str]]:
    calls: dict[int, list[str]] = {}
    for d in deltas:
        if d.id is not None:
            assert d.index not in calls, "id and name come once, first"
            assert d.id.startswith("call_")
            calls[d.index] = [d.name or "", d.kind, ""]
        calls[d.index][2] += d.arguments
    return [(name, kind, args) for name, kind, args in (calls[i] for i in sorted(calls))]


def feed_chunks(syntax: CallSyntax, text: str, cuts: list[int]) -> list[ToolCallDelta]:
    parser = CallStreamParser(syntax)
    out: list[ToolCallDelta] = []
    bounds = [0, *sorted(cuts), len(text)]
    for a, b in itertools.pairwise(bounds):
        out += parser.feed(text[a:b])
    assert parser.count == 3
    return out


@pytest.mark.parametrize("syntax", [QWEN_SYNTAX, BARE_SYNTAX], ids=["qwen", "bare"])
def test_any_chunking_gives_the_same_calls(syntax: CallSyntax) -> None:
    text = render(syntax, CALLS)
    expected = [
        ("get_weather", "function", CALLS[0][1]),
        ("apply_patch", "custom", PATCH),
        ("lookup", "function", CALLS[2][1]),
    ]
    assert reassemble(feed_chunks(syntax, text, [])) == expected
    assert reassemble(feed_chunks(syntax, text, list(range(1, len(text))))) == expected
    rng = random.Random(7)
    for _ in range(200):
        cuts = rng.sample(range(1, len(text)), rng.randint(1, 30))
        assert reassemble(feed_chunks(syntax, text, cuts)) == expected
    for _name, kind, args in expected:
        if kind == "function":
            json.loads(args)


def test_arguments_stream_before_the_call_ends() -> None:
    parser = CallStreamParser(QWEN_SYNTAX)
    first = parser.feed('<tool_call>\n{"name": "get_weather", "arguments": {"ci')
    assert [(d.name, d.arguments) for d in first] == [("get_weather", ""), (None, '{"ci')]
    assert parser.count == 0
    rest = parser.feed('ty": "Oslo"}}\n</tool_call>')
    assert "".join(d.arguments for d in first + rest) == '{"city": "Oslo"}'
    assert parser.count == 1


def request(**kw: Any) -> GenerationRequest:
    base: dict[str, Any] = {
        "model": "m",
        "messages": (),
        "effort": "low",
        "budget": ReasoningBudget(0, 8),
        "max_output_tokens": 64,
    }
    return GenerationRequest(**{**base, **kw})


WEATHER = ToolSpec("get_weather", parameters={"type": "object", "properties": {}})
PATCHER = ToolSpec("apply_patch", kind="custom")


def test_plan_follows_tool_choice() -> None:
    tools = (WEATHER, PATCHER)
    required = plan_answer(request(tools=tools, tool_choice=ToolChoice("required")), QWEN_SYNTAX)
    assert required.decide == "calls" and required.calls is not None
    assert "get_weather" in required.calls.text() and "Begin Patch" in required.calls.text()
    assert f"{{0,{MAX_PARALLEL_CALLS - 1}}}" in required.calls.text()
    named = plan_answer(
        request(tools=tools, tool_choice=ToolChoice("named", "get_weather"), parallel_tool_calls=False),
        QWEN_SYNTAX,
    )
    assert named.calls is not None and "Begin Patch" not in named.calls.text()
    assert named.calls.start == "call"  # exactly one call without parallel calls
    auto = plan_answer(request(tools=tools), QWEN_SYNTAX)
    assert auto.decide == "model" and auto.text is not None and auto.text.free_text
    none = plan_answer(request(tools=tools, tool_choice=ToolChoice("none")), QWEN_SYNTAX)
    assert none.calls is None and none.text is None
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    structured = plan_answer(request(output_format=OutputFormat("json_schema", schema, "a")), BARE_SYNTAX)
    assert structured.text is not None and '"integer"' in structured.text.text()


def test_auto_decision_step() -> None:
    tools = (WEATHER, ToolSpec("add", "Adds two integers.\nExactly two."))
    prompt = decision_prompt(tools, "What's the weather\nin Oslo?")
    # The asked-about case comes last, on one line each, after the few-shot examples.
    assert prompt.endswith(
        "Tools: get_weather, add (Adds two integers. Exactly two)\nMessage: What's the weather in Oslo?\nDecision:"
    )
    assert decision_grammar(tools).endswith('start: " " ("get_weather" | "add" | "none")')
    convo = (Message("user", "hi"), Message("assistant", "x"), Message("user", "weather?"))
    assert last_user_text(request(messages=convo)) == "weather?"
    after_results = (*convo, Message("tool", "{}", tool_call_id="c"))
    assert last_user_text(request(messages=after_results)) is None


def test_a_call_written_in_the_reasoning_counts() -> None:
    tools = (WEATHER,)
    assert reasoning_writes_call('{"name": "get_weather", "arguments": {}}', tools, BARE_SYNTAX)
    assert reasoning_writes_call("<tool_call> maybe", tools, QWEN_SYNTAX)
    assert not reasoning_writes_call("I could use get_weather.", tools, QWEN_SYNTAX)
    assert not reasoning_writes_call('{"name": "get_weathers"}', tools, BARE_SYNTAX)
    # Right after get_weather's results, writing that call out again is not a new call.
    answered = frozenset({"get_weather"})
    assert not reasoning_writes_call('{"name": "get_weather", "arguments": {}}', tools, BARE_SYNTAX, answered)
    assert not reasoning_writes_call("<tool_call> maybe", tools, QWEN_SYNTAX, answered)


def test_time_formats_become_bounded_patterns() -> None:
    schema = {
        "type": "object",
        "properties": {
            "at": {"type": "string", "format": "date-time"},
            "format": {"type": "string", "format": "time"},
            "day": {"type": "string", "format": "date"},
        },
    }
    text = plan_answer(request(output_format=OutputFormat("json_schema", schema, "a")), BARE_SYNTAX).text
    assert text is not None
    body = text.text()
    assert '"format":"time"' not in body and '"format":"date-time"' not in body
    assert '"format":"date"' in body and "[0-9]{1,6}" in body


def test_numbers_get_an_end() -> None:
    schema = {
        "type": "object",
        "properties": {
            "x": {"type": "number", "minimum": 0},
            "n": {"type": ["integer", "null"]},
            "e": {"enum": [{"type": "number"}]},
        },
    }
    text = plan_answer(request(output_format=OutputFormat("json_schema", schema, "a")), BARE_SYNTAX).text
    assert text is not None
    body = text.text()
    assert '"x":{"type":"number","minimum":0,"multipleOf":0.0001,"exclusiveMaximum"' in body
    assert '"n":{"type":["integer","null"],"exclusiveMinimum":' in body
    assert '"enum":[{"type":"number"}]' in body  # literal values stay as they are
