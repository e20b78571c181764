"""Closing a cut JSON answer, without a model: every cut of a valid answer, closed, parses and
validates under its schema; a cut tool call, closed and fed to the call parser, becomes one
whole call whose arguments validate."""

from __future__ import annotations

import json
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from kimi_server.engines.llamacpp.closing import close_answer, close_call
from kimi_server.engines.llamacpp.grammar import BARE_SYNTAX, QWEN_SYNTAX, CallSyntax
from kimi_server.engines.llamacpp.toolcalls import CallStreamParser
from kimi_server.engines.types import (
    AnswerPrefix,
    GenerationRequest,
    Message,
    OutputFormat,
    ReasoningBudget,
    ToolCallDelta,
    ToolSpec,
)
from kimi_server.parsers.json_closing import close_json
from kimi_server.parsers.schema_fill import Budget

Schema = dict[str, Any]

RECORD: Schema = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 2, "maxLength": 40},
        "age": {"type": "integer", "minimum": 18, "maximum": 99},
        "ratio": {"type": "number", "exclusiveMinimum": 0, "maximum": 5},
        "big": {"type": "number"},
        "ok": {"type": "boolean"},
        "none": {"type": "null"},
        "color": {"enum": ["red", "green", "blue"]},
        "code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{2}$"},
        "when": {"type": "string", "format": "date"},
        "id": {"type": "string", "format": "uuid"},
        "grid": {
            "type": "array",
            "items": {"type": "array", "items": {"type": "integer"}, "minItems": 2},
            "minItems": 1,
        },
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 4},
        "either": {
            "anyOf": [
                {"type": "integer"},
                {
                    "type": "object",
                    "properties": {"v": {"type": "string", "minLength": 3}},
                    "required": ["v"],
                    "additionalProperties": False,
                },
            ]
        },
        "where": {"$ref": "#/$defs/point"},
    },
    "required": ["name", "age", "ratio", "big", "ok", "none", "color", "code", "when", "id", "grid", "tags", "either"],
    "additionalProperties": False,
    "$defs": {
        "point": {
            "type": "object",
            "properties": {"x": {"type": "integer"}, "unit": {"enum": ["cm", "m"]}},
            "required": ["x", "unit"],
            "additionalProperties": False,
        }
    },
}

# Valid answers in the grammar's canonical layout, with escapes of every kind in strings.
ANSWERS = [
    '{"name": "Ana \\"Lu\\" \\\\ \\/ \\n\\t \\u00e9 \\ud83d\\ude00 ok", "age": 42, "ratio": 0.25, '
    '"big": -12.5e+3, "ok": true, "none": null, "color": "green", "code": "AB-12", '
    '"when": "2024-02-29", "id": "123e4567-e89b-12d3-a456-426614174000", "grid": [[1, 2], [3, -4, 5]], '
    '"tags": ["x", "y"], "either": {"v": "abc"}, "where": {"x": 7, "unit": "cm"}}',
    '{"name": "Bo", "age": 18, "ratio": 5, "big": 1E-2, "ok": false, "none": null, "color": "red", '
    '"code": "ZZ-00", "when": "1999-12-31", "id": "00000000-0000-0000-0000-000000000000", '
    '"grid": [[0, 0]], "tags": ["", "a b", "c"], "either": -3}',
]


def valid(schema: Schema, text: str) -> list[str]:
    validator = Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)
    return [e.message for e in validator.iter_errors(json.loads(text))]


@pytest.mark.parametrize("answer", ANSWERS, ids=["escapes-and-nesting", "bounds"])
def test_every_cut_of_a_valid_answer_closes_to_a_valid_one(answer: str) -> None:
    assert valid(RECORD, answer) == []
    for cut in range(1, len(answer)):
        text = answer[:cut]
        closing = close_json(text, RECORD)
        assert closing is not None, text
        assert valid(RECORD, text + closing) == [], (text, closing)


def test_every_cut_closes_to_json_without_a_schema() -> None:
    answer = '{"a": [1, -2.5e-3, true, false, null, "s\\"\\\\\\u00e9\\ud83d\\ude00"], "b": {"c": [[], {}]}}'
    for cut in range(1, len(answer)):
        closing = close_json(answer[:cut])
        assert closing is not None
        json.loads(answer[:cut] + closing)


@pytest.mark.parametrize(
    ("text", "closing"),
    [
        ('{"name": "Ana', '"}'),  # a string
        ('{"s": "a\\', '\\"}'),  # just after a backslash: an escaped backslash
        ('{"s": "\\u00', '00"}'),  # inside a \u escape
        ('{"s": "\\ud83d', '\\udc00"}'),  # a high surrogate gets its low half
        ('{"s": "\\uD8', '00\\udc00"}'),
        ('{"n": -', "0}"),  # a number that cannot end yet
        ('{"n": 1.', "0}"),
        ('{"n": 2e+', "0}"),
        ('{"n": 12', "}"),
        ('{"t": tr', "ue}"),
        ('{"f": fa', "lse}"),
        ('{"z": n', "ull}"),
        ('{"a": [[1, [', "]]]}"),
        ('{"a": [1, ', "null]}"),
        ('{"a"', ": null}"),
        ('{"a":', " null}"),
        ('{"a": 1, ', '"": null}'),  # a comma asks for a member
        ("[", "]"),
        ('"abc', '"'),
        ('{"a": 1}', ""),  # already whole
    ],
)
def test_the_shortest_syntactic_closing(text: str, closing: str) -> None:
    assert close_json(text) == closing
    json.loads(text + closing)


def test_missing_required_members_get_short_valid_values() -> None:
    closing = close_json('{"name": "Al', RECORD)
    assert closing is not None
    value = json.loads('{"name": "Al' + closing)
    assert valid(RECORD, '{"name": "Al' + closing) == []
    assert value["age"] == 18 and value["ok"] is False and value["none"] is None
    assert value["color"] == "red" and len(value["tags"]) == 2 and value["either"] == 0


def test_a_cut_key_becomes_a_property_the_schema_names() -> None:
    schema = {
        "type": "object",
        "properties": {"temperature": {"type": "number"}, "unit": {"enum": ["c", "f"]}},
        "required": ["temperature", "unit"],
        "additionalProperties": False,
    }
    assert close_json('{"temperature": 3, "un', schema) == 'it": "c"}'
    assert close_json('{"tem', schema) == 'perature": 0, "unit": "c"}'


def test_a_schema_whose_pattern_cannot_be_searched_still_closes_to_json() -> None:
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^(a+)+$"}}, "required": ["s"]}
    text = '{"s": "' + "a" * 30
    closing = close_json(text, schema, budget=Budget(checks=10))
    assert closing is not None
    json.loads(text + closing)


def test_text_no_json_value_begins_with_has_no_closing() -> None:
    assert close_json("") is None
    assert close_json("  ") is None
    assert close_json("hello") is None
    assert close_json('{"a" 1') is None


def request(fmt: OutputFormat, prefix: AnswerPrefix | None = None) -> GenerationRequest:
    return GenerationRequest(
        model="kimi-k3.1-pro",
        messages=(Message("user", "Fill in a record."),),
        effort="low",
        budget=ReasoningBudget(0, 10),
        max_output_tokens=16,
        output_format=fmt,
        answer_prefix=prefix,
    )


def test_a_partial_mode_answer_is_closed_together_with_the_clients_prefix() -> None:
    # The answer continues the client's '{"name": ' and does not repeat it.
    req = request(OutputFormat("json_object"), AnswerPrefix('{"name": '))
    said = '"Ann", "tags": ["a'
    closing = close_answer(said, req, {"type": "object"})
    assert json.loads('{"name": ' + said + closing) == {"name": "Ann", "tags": ["a"]}


TOOLS = (
    ToolSpec(
        "get_weather",
        parameters={
            "type": "object",
            "properties": {"city": {"type": "string", "minLength": 1}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
        strict=True,
    ),
    ToolSpec("get_time", parameters=None),
)


def calls_of(deltas: list[ToolCallDelta]) -> list[tuple[str, str]]:
    calls: dict[int, list[str]] = {}
    for d in deltas:
        if d.name is not None:
            calls[d.index] = [d.name, ""]
        calls[d.index][1] += d.arguments
    return [(name, args) for name, args in (calls[i] for i in sorted(calls))]


@pytest.mark.parametrize("syntax", [QWEN_SYNTAX, BARE_SYNTAX], ids=["qwen", "bare"])
def test_every_cut_of_a_call_closes_to_one_whole_valid_call(syntax: CallSyntax) -> None:
    text = f'{syntax.open}{{"name": "get_weather", "arguments": {{"city": "Oslo \\"N\\"", "unit": "celsius"}}}}'
    text += syntax.close
    schema = TOOLS[0].parameters
    assert schema is not None
    for cut in range(1, len(text)):
        parser = CallStreamParser(syntax)
        deltas = parser.feed(text[:cut])
        deltas += parser.feed(close_call(parser, TOOLS))
        calls = calls_of(deltas)
        assert len(calls) == 1 and calls[0][0] == "get_weather", (text[:cut], calls)
        assert valid(schema, calls[0][1]) == [], (text[:cut], calls)
        assert parser.count == 1 and parser.pending == ""


def test_a_second_call_not_yet_named_is_left_out() -> None:
    first = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    parser = CallStreamParser(QWEN_SYNTAX)
    deltas = parser.feed(first + '\n<tool_call>\n{"name": "get_w')
    deltas += parser.feed(close_call(parser, TOOLS))
    assert calls_of(deltas) == [("get_time", "{}")]


def test_a_cut_patch_is_not_completed() -> None:
    parser = CallStreamParser(BARE_SYNTAX)
    parser.feed("*** Begin Patch\n*** Add File: a.txt\n+hel")
    assert close_call(parser, (ToolSpec("apply_patch", kind="custom"),)) == ""
