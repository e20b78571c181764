"""Reasoning switched off (the moonshot contract's ``thinking: disabled``) on the embedded
engine's phases, over the scripted llama.cpp server of test_phases: one answer call, no
reasoning, for both reasoning formats."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from kimi_server.engines.llamacpp.answer import plan_answer
from kimi_server.engines.llamacpp.grammar import syntax_for_template
from kimi_server.engines.llamacpp.phases import PhaseContext, prompted_generation
from kimi_server.engines.llamacpp.runner import CompletionRunner
from kimi_server.engines.llamacpp.template import CHATML
from kimi_server.engines.types import ContentDelta, EngineEvent, Finish, ReasoningDelta
from kimi_server.parsers.reasoning import get_reasoning_format
from tests.test_phases import FakeLlama, answer_prompt, request


def run(llama: FakeLlama, fmt_name: str, *, reasoning: bool) -> list[EngineEvent]:
    req = dataclasses.replace(request(floor=12, cap=50, max_out=100), reasoning=reasoning)

    async def main() -> list[EngineEvent]:
        fmt = get_reasoning_format(fmt_name)
        ctx = PhaseContext(CompletionRunner(llama), req, fmt, {}, answer_prompt=answer_prompt)
        plan = plan_answer(req, syntax_for_template(CHATML))
        return [e async for e in prompted_generation(ctx, "PROMPT", plan)]

    return asyncio.run(main())


@pytest.mark.parametrize("fmt_name", ["prompted", "think-tags"])
def test_no_reasoning_phase_when_switched_off(fmt_name: str) -> None:
    llama = FakeLlama(natural_stop=4)
    events = run(llama, fmt_name, reasoning=False)
    assert not [e for e in events if isinstance(e, ReasoningDelta)]
    # The fake starts every call at w0: the masked lead, then the rest of the answer.
    assert "".join(e.text for e in events if isinstance(e, ContentDelta)).strip() == "w0 w1 w2 w0 w1 w2 w3"
    finish = events[-1]
    assert isinstance(finish, Finish) and finish.usage.reasoning_tokens == 0
    # Only the answer's calls (its masked lead, then the rest), straight after the conversation;
    # a natively thinking model sees its thinking block opened and closed empty.
    fmt = get_reasoning_format(fmt_name)
    expected = "PROMPT" if fmt_name == "prompted" else "PROMPT" + fmt.opener + fmt.closer
    assert [c["prompt"] for c in llama.calls] == [expected, expected + "w0 w1 w2 "]


@pytest.mark.parametrize("fmt_name", ["prompted", "think-tags"])
def test_reasoning_on_still_reasons(fmt_name: str) -> None:
    events = run(FakeLlama(natural_stop=4), fmt_name, reasoning=True)
    assert [e for e in events if isinstance(e, ReasoningDelta)]
    finish = events[-1]
    assert isinstance(finish, Finish) and finish.usage.reasoning_tokens > 0
