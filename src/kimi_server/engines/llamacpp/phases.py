"""A request's generation on top of raw completions: the reasoning step, then the answer step.

- ``phase_context.py``: what the calls of one request share (slot, sampling, tally) and the
  one way to make a call.
- ``reasoning_step.py``: prompted attempts, or one native thinking call.
- ``answer_step.py``: the answer built on that reasoning, or the chosen attempt as the answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from kimi_server.engines.llamacpp.answer import AnswerPlan
from kimi_server.engines.llamacpp.answer_step import answer_step, chosen_as_answer
from kimi_server.engines.llamacpp.decide import model_wants_call
from kimi_server.engines.llamacpp.phase_context import (
    ANSWER_LEAD,
    PhaseContext,
    Tally,
    answer_room,
    answer_turn,
    open_thinking,
)
from kimi_server.engines.llamacpp.reasoning_step import Reasoned, reasoning_step
from kimi_server.engines.types import EngineEvent

__all__ = ["ANSWER_LEAD", "PhaseContext", "Tally", "answer_turn", "prompted_generation"]


async def prompted_generation(ctx: PhaseContext, prompt: str, plan: AnswerPlan) -> AsyncIterator[EngineEvent]:
    # Under tool_choice auto the decision step runs alongside the reasoning (see decide.py).
    decision: asyncio.Task[bool] | None = None
    if plan.decide == "model":
        decision = asyncio.create_task(model_wants_call(ctx.runner, ctx.request, plan.tools, slot=ctx.utility_slot))
    try:
        async for event in _generate(ctx, prompt, plan, decision):
            yield event
    finally:
        if decision is not None and not decision.done():
            decision.cancel()


async def _generate(
    ctx: PhaseContext, prompt: str, plan: AnswerPlan, decision: asyncio.Task[bool] | None
) -> AsyncIterator[EngineEvent]:
    constrained = plan.calls is not None or plan.text is not None
    ctx.answer_room = answer_room(ctx.request.max_output_tokens, constrained=constrained)
    opened = open_thinking(prompt, ctx.fmt)
    # Prompted attempts are replies to the conversation: under Partial Mode each continues the
    # prefix, and the chosen one is the answer's continuation (a native model's thinking comes
    # before the prefix: answer_step puts it after the thinking block).
    attempted = prompt + ctx.lead if ctx.fmt.kind == "prompted" else prompt
    reasoned = Reasoned()
    async for step in reasoning_step(ctx, attempted, opened, plan):
        if isinstance(step, Reasoned):
            reasoned = step
        else:
            yield step
    if reasoned.chosen is not None:
        async for event in chosen_as_answer(ctx, attempted, reasoned.chosen, reasoned.index):
            yield event
        return
    if ctx.context_full or ctx.tally.completion >= ctx.request.max_output_tokens:
        yield ctx.finish("length")
        return
    async for event in answer_step(ctx, prompt, opened, reasoned.text, plan, decision):
        yield event
