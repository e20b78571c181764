"""A grammar-bound answer cut by the output cap or by the repetition guard ends valid: the engine
closes its JSON (a structured answer, or a call's arguments) with a last delta and says
``finish_reason: "length"``. Over a scripted llama.cpp (no model)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

from jsonschema import Draft202012Validator

from kimi_server.engines.llamacpp.answer import plan_answer
from kimi_server.engines.llamacpp.grammar import syntax_for_template
from kimi_server.engines.llamacpp.phases import PhaseContext, prompted_generation
from kimi_server.engines.llamacpp.repetition import RepetitionLimits
from kimi_server.engines.llamacpp.runner import CompletionRunner
from kimi_server.engines.llamacpp.template import CHATML
from kimi_server.engines.types import (
    ContentDelta,
    EngineEvent,
    Finish,
    OutputFormat,
    ToolCallDelta,
    ToolChoice,
    ToolSpec,
)
from kimi_server.parsers.reasoning import get_reasoning_format
from tests.test_phases import FakeLlama, answer_prompt, request

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 200},
        "days": {"type": "array", "items": {"type": "integer", "minimum": 1}, "minItems": 1},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "days", "unit"],
    "additionalProperties": False,
}
ANSWER = '{"city": "S\\u00e3o \\"Paulo\\"", "days": [1, 2, 3], "unit": "celsius"}'
SYNTAX = syntax_for_template(CHATML)
CALL = f'{SYNTAX.open}{{"name": "forecast", "arguments": {ANSWER}}}{SYNTAX.close}'


class GrammarLlama(FakeLlama):
    """Reasons in words; under a grammar says ``text`` three characters a token, up to its
    n_predict."""

    def __init__(self, text: str) -> None:
        super().__init__(natural_stop=2)
        self.text = text

    def handle_completions(self, body: dict[str, Any], callback: Any = None) -> None:
        if "grammar" not in body:
            super().handle_completions(body, callback)
            return
        self.calls.append(body)
        pieces = [self.text[i : i + 3] for i in range(0, len(self.text), 3)]
        said = pieces[: body["n_predict"]]
        for piece in said:
            if callback({"choices": [{"text": piece, "finish_reason": None}], "timings": {"predicted_n": 1}}):
                return
        reason = "length" if len(said) < len(pieces) else "stop"
        usage = {"prompt_tokens": self.prompt_tokens, "completion_tokens": len(said)}
        callback({"choices": [{"text": "", "finish_reason": reason}], "usage": usage, "timings": {"cache_n": 0}})


def run(llama: FakeLlama, max_out: int, *, tools: bool = False, guard: RepetitionLimits | None = None) -> list[Any]:
    req = request(floor=2, cap=4, max_out=max_out)
    if tools:
        tool = ToolSpec("forecast", parameters=SCHEMA, strict=True)
        req = dataclasses.replace(req, tools=(tool,), tool_choice=ToolChoice("required"))
    else:
        req = dataclasses.replace(req, output_format=OutputFormat("json_schema", SCHEMA, "forecast", True))

    async def main() -> list[EngineEvent]:
        fmt = get_reasoning_format("prompted")
        ctx = PhaseContext(CompletionRunner(llama), req, fmt, {}, answer_prompt=answer_prompt, repetition=guard)
        return [e async for e in prompted_generation(ctx, "PROMPT", plan_answer(req, SYNTAX))]

    return asyncio.run(main())


def valid(text: str) -> bool:
    return bool(Draft202012Validator(SCHEMA).is_valid(json.loads(text)))


def test_a_structured_answer_cut_by_the_cap_is_closed_valid_with_length() -> None:
    whole = run(GrammarLlama(ANSWER), max_out=200)
    assert isinstance(whole[-1], Finish) and whole[-1].reason == "stop"
    seen = set()
    for max_out in range(5, 40):
        events = run(GrammarLlama(ANSWER), max_out=max_out)
        finish = events[-1]
        content = "".join(e.text for e in events if isinstance(e, ContentDelta))
        assert isinstance(finish, Finish)
        if finish.reason == "stop":  # room enough at last
            assert content == ANSWER
            break
        assert finish.reason == "length" and valid(content), (max_out, content)
        assert not finish.looped  # the cap, not the repetition guard
        # What the model said comes first, untouched; the closing is the last delta.
        said = "".join(e.text for e in events[:-2] if isinstance(e, ContentDelta))
        assert ANSWER.startswith(said) and content.startswith(said)
        seen.add(said)
        # The closing is the server's text: the usage counts only the model's tokens.
        assert finish.usage.completion_tokens <= max_out
    assert len(seen) > 5  # cut at many places


def test_a_forced_call_cut_by_the_cap_is_one_whole_call_with_valid_arguments() -> None:
    cuts = 0
    for max_out in range(5, 60):
        events = run(GrammarLlama(CALL), max_out=max_out, tools=True)
        deltas = [e for e in events if isinstance(e, ToolCallDelta)]
        finish = events[-1]
        assert [d.name for d in deltas if d.name] == ["forecast"], max_out
        arguments = "".join(d.arguments for d in deltas)
        assert valid(arguments), (max_out, arguments)
        assert isinstance(finish, Finish)
        if finish.reason == "tool_calls":  # room enough at last
            assert arguments == ANSWER
            break
        assert finish.reason == "length"
        cuts += 1
    assert cuts > 10


class LoopingLlama(GrammarLlama):
    """Under a grammar, opens a string and repeats itself inside it until stopped."""

    def __init__(self) -> None:
        super().__init__('{"city": "' + "la " * 400)


def test_a_structured_answer_the_repetition_guard_cut_is_closed_valid() -> None:
    llama = LoopingLlama()
    guard = RepetitionLimits(max_ngram=4, min_repeats=4, min_tokens=12)
    events = run(llama, max_out=400, guard=guard)
    finish = events[-1]
    content = "".join(e.text for e in events if isinstance(e, ContentDelta))
    assert isinstance(finish, Finish) and finish.reason == "length" and finish.looped
    assert finish.usage.completion_tokens < 100  # the guard, not the cap
    assert valid(content), content
    assert json.loads(content)["city"].startswith("la la la")
