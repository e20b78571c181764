"""The answer phase over a fake llama.cpp runner: which grammar each step gets, how the auto
decision steers the answer, and how a grammar that fails to compile becomes a 400."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from kimi_server.engines.llamacpp.answer import GrammarChecker, plan_answer
from kimi_server.engines.llamacpp.grammar import PROBE_LITERAL, QWEN_SYNTAX
from kimi_server.engines.llamacpp.phases import PhaseContext, answer_turn, prompted_generation
from kimi_server.engines.llamacpp.runner import CompletionResult
from kimi_server.engines.llamacpp.template import CHATML, ChatTemplate
from kimi_server.engines.types import (
    ContentDelta,
    EngineEvent,
    Finish,
    GenerationRequest,
    Message,
    ReasoningBudget,
    ToolCallDelta,
    ToolChoice,
    ToolSpec,
)
from kimi_server.errors import InvalidRequestError
from kimi_server.parsers.reasoning import get_reasoning_format

Reply = Callable[[dict[str, Any]], str]


class FakeRunner:
    """Answers each completion body with ``reply(body)``, streamed in 3-character pieces."""

    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        self.bodies: list[dict[str, Any]] = []

    async def stream(self, body: dict[str, Any]) -> AsyncIterator[str | CompletionResult]:
        self.bodies.append(body)
        text = self.reply(body)
        for i in range(0, len(text), 3):
            yield text[i : i + 3]
        yield CompletionResult(text, "stop", 10, 0, max(1, len(text) // 4))


WEATHER = ToolSpec("get_weather", "Weather for a city.", {"type": "object", "properties": {"city": {"type": "string"}}})
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'


def request(question: str, **kw: Any) -> GenerationRequest:
    kw.setdefault("tools", (WEATHER,))
    return GenerationRequest(
        model="m",
        messages=(Message("user", question),),
        effort="low",
        budget=ReasoningBudget(0, 16),
        max_output_tokens=200,
        **kw,
    )


def reply_for(decision: str, answer_text: str) -> Reply:
    def reply(body: dict[str, Any]) -> str:
        grammar = body.get("grammar", "")
        if "Decision:" in body["prompt"]:
            return f" {decision}"
        if "stop" in body and not grammar:
            return "Let me think."  # the reasoning phase
        if "<tool_call>" in grammar and "ANSWER_TEXT" not in grammar:
            return CALL
        return answer_text

    return reply


def run(runner: FakeRunner, req: GenerationRequest) -> list[EngineEvent]:
    async def go() -> list[EngineEvent]:
        fmt = get_reasoning_format("prompted")
        ctx = PhaseContext(runner, req, fmt, {}, answer_prompt=answer_turn(ChatTemplate(CHATML), req, fmt))  # type: ignore[arg-type]
        plan = plan_answer(req, QWEN_SYNTAX)
        return [e async for e in prompted_generation(ctx, "PROMPT", plan)]

    return asyncio.run(go())


def test_auto_follows_the_decision_step() -> None:
    calls = run(FakeRunner(reply_for("get_weather", "unused")), request("Weather in Oslo?"))
    deltas = [e for e in calls if isinstance(e, ToolCallDelta)]
    assert deltas[0].name == "get_weather" and deltas[0].id
    assert "".join(d.arguments for d in deltas) == '{"city": "Oslo"}'
    assert isinstance(calls[-1], Finish) and calls[-1].reason == "tool_calls"

    runner = FakeRunner(reply_for("none", "Hello!"))
    text = run(runner, request("Hi!"))
    assert "".join(e.text for e in text if isinstance(e, ContentDelta)) == "Hello!"
    assert isinstance(text[-1], Finish) and text[-1].reason == "stop"
    answer_body = runner.bodies[-1]
    assert "ANSWER_TEXT" in answer_body["grammar"]  # text that may not begin like a call


def test_required_skips_the_decision_and_the_stop_sequences() -> None:
    runner = FakeRunner(reply_for("none", "unused"))
    events = run(runner, request("Hi!", tool_choice=ToolChoice("required"), stop=("}",)))
    assert isinstance(events[-1], Finish) and events[-1].reason == "tool_calls"
    assert not any("Decision:" in b["prompt"] for b in runner.bodies)
    assert "stop" not in runner.bodies[-1]  # a stop sequence must not cut a call short


def test_checker_names_the_tool_whose_schema_fails_and_caches_verdicts() -> None:
    bad = ToolSpec(
        "bad_tool", parameters={"type": "object", "properties": {"a": {"type": "string", "pattern": "^a\\Z"}}}
    )

    def reply(body: dict[str, Any]) -> str:
        # Like llama.cpp: a grammar that fails to compile is ignored and sampling runs free.
        return "The" if "\\\\Z" in body["grammar"] else PROBE_LITERAL[:2]

    runner = FakeRunner(reply)
    checker = GrammarChecker(runner)  # type: ignore[arg-type]
    req = request("x", tools=(WEATHER, bad), tool_choice=ToolChoice("required"))
    plan = plan_answer(req, QWEN_SYNTAX)
    with pytest.raises(InvalidRequestError) as info:
        asyncio.run(checker.check(plan, req))
    assert info.value.param == "tools[1].parameters"
    probes = len(runner.bodies)
    with pytest.raises(InvalidRequestError):
        asyncio.run(checker.check(plan, req))
    assert len(runner.bodies) == probes  # the verdicts were remembered
    good = request("x", tool_choice=ToolChoice("required"))
    asyncio.run(checker.check(plan_answer(good, QWEN_SYNTAX), good))


def test_the_drafts_framing_is_scrubbed_from_text_under_the_tools_text_grammar() -> None:
    fmt = get_reasoning_format("prompted")
    copied = fmt.follow_up.format(draft="It is sunny.")
    runner = FakeRunner(reply_for("none", copied))
    events = run(runner, request("Hi!"))
    text = "".join(e.text for e in events if isinstance(e, ContentDelta))
    assert text == "It is sunny."
