"""Partial Mode in the embedded engine's own parts: where a JSON prefix stops, the grammar of
what may follow it, and the prompt the answer continues (the speaker's name, then the prefix,
right after the assistant turn's opening)."""

from __future__ import annotations

import pytest

from kimi_server.engines.llamacpp.answer import plan_answer
from kimi_server.engines.llamacpp.answer_prefix import lead_text
from kimi_server.engines.llamacpp.grammar import BARE_SYNTAX
from kimi_server.engines.llamacpp.template import ChatTemplate
from kimi_server.engines.types import (
    AnswerPrefix,
    GenerationRequest,
    Message,
    OutputFormat,
    ReasoningBudget,
    ToolChoice,
    ToolSpec,
)
from kimi_server.errors import InvalidRequestError
from kimi_server.parsers.json_prefix import scan_json_prefix


def request(prefix: AnswerPrefix, **fields: object) -> GenerationRequest:
    return GenerationRequest(
        model="kimi-k3.1-pro",
        messages=(Message("user", "Who are you?"),),
        effort="low",
        budget=ReasoningBudget(0, 10),
        max_output_tokens=100,
        answer_prefix=prefix,
        **fields,  # type: ignore[arg-type]
    )


def test_the_prompt_ends_with_the_name_and_the_prefix_after_the_assistant_opening() -> None:
    template = ChatTemplate(None)  # ChatML
    prompt = template.render((Message("user", "Who are you?"),))
    assert prompt.endswith("<|im_start|>assistant\n")
    assert prompt + lead_text(AnswerPrefix("I am", "Dr. Kelsier")) == prompt + "Dr. Kelsier: I am"
    assert lead_text(AnswerPrefix("", "Dr. Kelsier")) == "Dr. Kelsier:"
    assert lead_text(AnswerPrefix("Once upon")) == "Once upon"
    assert lead_text(None) == ""
    # Under a json_schema the grammar writes the opening bracket itself.
    assert lead_text(AnswerPrefix(" {"), echo="{") == " "


@pytest.mark.parametrize(
    ("text", "state", "frames"),
    [
        ("{", "object_open", ("object",)),
        ('{"name": "Al', "string", ("object",)),
        ('{"a": [1, tr', "literal", ("object", "array")),
        ('{"a": 1.5e', "number", ("object",)),
        ('{"a": "x\\u00', "string", ("object",)),
        ('{"a": {"b": 2}, ', "key", ("object",)),
        ("{}", "after", ()),
    ],
)
def test_where_a_json_prefix_stops(text: str, state: str, frames: tuple[str, ...]) -> None:
    scanned = scan_json_prefix(text)
    assert scanned is not None and (scanned.state, scanned.frames) == (state, frames)


@pytest.mark.parametrize("text", ['{"a": 01', "{} {", '{"a" 1', '{"a": "\\x', "{]", "nul1", '{"a": 1.}'])
def test_no_json_begins_so(text: str) -> None:
    assert scan_json_prefix(text) is None


def test_the_json_object_grammar_continues_the_prefix() -> None:
    plan = plan_answer(request(AnswerPrefix('{"a": [1, "x'), output_format=OutputFormat("json_object")), BARE_SYNTAX)
    assert plan.text is not None and plan.echo == ""
    # The rest of the string, then the array and the object closed, innermost first.
    assert plan.text.start == "STRING_REST arr_tail obj_tail"
    plan = plan_answer(request(AnswerPrefix("{"), output_format=OutputFormat("json_object")), BARE_SYNTAX)
    assert plan.text is not None and plan.text.start == '("}" | KEY ": " json_value obj_tail)'


def test_json_schema_takes_the_opening_bracket_only() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    fmt = OutputFormat("json_schema", schema, "x")
    plan = plan_answer(request(AnswerPrefix("{"), output_format=fmt), BARE_SYNTAX)
    assert plan.echo == "{" and plan.text is not None and plan.text.start == "answer_json"
    with pytest.raises(InvalidRequestError) as caught:
        plan_answer(request(AnswerPrefix('{"a": "', param="messages[1].partial"), output_format=fmt), BARE_SYNTAX)
    assert caught.value.param == "messages[1].partial"


def test_a_prefix_makes_the_answer_text_and_refuses_a_forced_call() -> None:
    tool = ToolSpec("lookup", parameters={"type": "object", "properties": {}})
    plan = plan_answer(request(AnswerPrefix("I"), tools=(tool,)), BARE_SYNTAX)
    assert (plan.decide, plan.calls, plan.text) == ("text", None, None)
    with pytest.raises(InvalidRequestError):
        plan_answer(request(AnswerPrefix("I"), tools=(tool,), tool_choice=ToolChoice("required")), BARE_SYNTAX)
