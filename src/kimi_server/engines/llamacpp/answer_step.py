"""The answer step of a request, after its reasoning: free text, text under a JSON grammar,
or tool calls (``answer_step``); or the chosen attempt given as the answer itself
(``chosen_as_answer``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

from kimi_server.engines.llamacpp.answer import AnswerPlan
from kimi_server.engines.llamacpp.closing import answer_schema, close_answer, close_call
from kimi_server.engines.llamacpp.decide import just_answered, reasoning_writes_call
from kimi_server.engines.llamacpp.phase_context import ANSWER_LEAD, LeadingTrim, PhaseContext, call
from kimi_server.engines.llamacpp.reasoning_step import Attempt
from kimi_server.engines.llamacpp.runner import CompletionResult
from kimi_server.engines.llamacpp.toolcalls import CallStreamParser
from kimi_server.engines.types import ContentDelta, EngineEvent, FinishReason, ToolSpec
from kimi_server.parsers.reasoning import MarkerScrub, PhraseScrub


async def answer(
    ctx: PhaseContext, prompt: str, extra: dict[str, Any], *, stops: bool = True
) -> AsyncIterator[str | CompletionResult]:
    remaining = ctx.request.max_output_tokens - ctx.tally.completion
    if not stops:
        async for item in call(ctx, ctx.body(prompt, remaining, **extra), reasoning=False):
            yield item
        return
    # Free text ends where the model opens or closes a reasoning block again. Its first tokens
    # may not end it, though: a model that believes its reasoning already answered would end
    # the turn at once, or reopen a think block, and leave the answer empty.
    stop = [*ctx.fmt.stops, *ctx.request.stop]
    lead = min(ANSWER_LEAD, remaining)
    bans = [[tag, False] for tag in ctx.fmt.stops]
    said: list[str] = []
    done = False
    body = ctx.body(prompt, lead, stop=stop, ignore_eos=True, logit_bias=bans, **extra)
    async for item in call(ctx, body, reasoning=False):
        if isinstance(item, CompletionResult):
            # Only a stop sequence ends the lead early (end-of-turn is masked).
            done = item.finish_reason == "stop" or lead == remaining
            if done:
                yield item
            continue
        said.append(item)
        yield item
    if done or ctx.context_full:
        return
    body = ctx.body(prompt + "".join(said), remaining - lead, stop=stop, **extra)
    async for item in call(ctx, body, reasoning=False):
        yield item


async def chosen_as_answer(ctx: PhaseContext, prompt: str, chosen: Attempt, index: int) -> AsyncIterator[EngineEvent]:
    """The chosen attempt given as the answer (free text under no grammar), continued where the
    cap cut it. It is the model's own reply to the conversation, and the one the other attempts
    agree with. Rewritten in a turn of its own it was measured to lose answers: the
    model commented on its draft ("Sure! Here's the draft of your reply:") or changed a right
    result. Its tokens were generated once, during the reasoning, and are counted (and billed)
    once, as reasoning: only what continues it adds to ``completion_tokens``. Being already
    generated, it is shown whole, and the cap is left to its continuation."""
    room = ctx.request.max_output_tokens - ctx.tally.completion
    scrub = MarkerScrub(ctx.fmt.markers)
    trim = LeadingTrim(keep=ctx.continues)
    # One delta, not one per token: a client parses each event, and these tokens are all here.
    if text := "".join(trim(scrub.feed(piece)) for piece in chosen.pieces):
        yield ContentDelta(text)
    cut = False
    word = chosen.stopping_word
    unfinished = not chosen.finished  # the reasoning cap stopped it
    if chosen.looped:
        ctx.looped = cut = True  # continued, it would loop on; the answer says the guard ended it
    elif unfinished and (ctx.reasoning_ended or room <= 0):
        cut = True  # no room left to finish it
    elif unfinished:
        stop = [*ctx.fmt.markers, *ctx.request.stop]
        body = ctx.body(prompt + chosen.raw, room, stop=stop, attempt=index)
        async for item in call(ctx, body, reasoning=False):
            if isinstance(item, CompletionResult):
                cut, word = item.finish_reason == "length", item.stopping_word
            elif text := trim(scrub.feed(item)):
                yield ContentDelta(text)
    if text := trim(scrub.flush()):
        yield ContentDelta(text)
    yield ctx.finish("length" if cut else "stop", word)


async def answer_step(
    ctx: PhaseContext, prompt: str, opened: str, reasoning: str, plan: AnswerPlan, decision: asyncio.Task[bool] | None
) -> AsyncIterator[EngineEvent]:
    """The answer, conditioned on ``reasoning``; ``decision``: the auto decision step running
    alongside the reasoning (decide.py), whether the answer is tool calls."""
    answered = just_answered(ctx.request)
    if ctx.fmt.kind == "prompted":
        # No draft worth showing (every attempt blank), or the conversation ends in tool
        # results (a draft there was seen to copy them, or to call again, rather than use them):
        # the answer is the model's own reply to the conversation.
        drafted = bool(reasoning.strip()) and not answered
        prefix = ctx.request.answer_prefix
        draft = prefix.text + reasoning if prefix is not None else reasoning  # the attempts continued it
        full = await ctx.answer_prompt(draft) if drafted else prompt
    else:
        full = opened + reasoning + ctx.fmt.closer
    full += ctx.lead  # Partial Mode: the answer continues the client's prefix
    mode = plan.decide
    if decision is not None:
        wants = await decision or reasoning_writes_call(reasoning, plan.tools, plan.syntax, answered)
        mode = "calls" if wants else "text"
    grammar = plan.calls if mode == "calls" else plan.text
    extra = {"grammar": grammar.text()} if grammar is not None else {}
    parser = CallStreamParser(plan.syntax) if mode == "calls" else None
    # Stop sequences would cut JSON or a call short of parsing; they only apply to text. Under
    # a grammar, marker text is scrubbed from the stream instead (it can only sit in a string).
    stops = grammar is None or grammar.free_text
    echo = plan.echo if mode == "text" else ""
    schema = answer_schema(ctx.request, grammar) if mode == "text" else None
    events = _answer_events(ctx, full, extra, parser, stops=stops, echo=echo, schema=schema, tools=plan.tools)
    async for event in events:
        yield event


async def _answer_events(
    ctx: PhaseContext,
    full: str,
    extra: dict[str, Any],
    parser: CallStreamParser | None,
    *,
    stops: bool,
    echo: str = "",
    schema: dict[str, Any] | None = None,
    tools: Sequence[ToolSpec] = (),
) -> AsyncIterator[EngineEvent]:
    """``schema``: a structured answer's, closed under it if it is cut; ``tools``: those whose
    parameters close a cut call's arguments (closing.py)."""
    trim = LeadingTrim(keep=ctx.continues)
    said: list[str] = []  # the text answer so far: a structured one is closed if cut
    skip = len(echo)  # what the grammar writes that the client sent as its prefix
    truncated = False
    word: str | None = None
    scrub = MarkerScrub(ctx.fmt.markers)
    # Free text only: JSON or a call never holds the draft's framing sentences.
    framing = PhraseScrub(ctx.fmt.scaffold if parser is None and stops else ())
    async for piece in answer(ctx, full, extra, stops=stops):
        if isinstance(piece, CompletionResult):
            truncated, word = piece.finish_reason == "length", piece.stopping_word
            piece = framing.feed(scrub.flush()) + framing.flush()
        else:
            piece = framing.feed(scrub.feed(piece))
        if skip:
            dropped = min(skip, len(piece))
            piece, skip = piece[dropped:], skip - dropped
        if not piece:
            continue
        if parser is not None:
            for delta in parser.feed(piece):
                yield delta
        elif text := trim(piece):
            said.append(text)
            yield ContentDelta(text)
    async for event in _ending(ctx, parser, truncated or ctx.context_full, word, schema, "".join(said), tools):
        yield event


async def _ending(
    ctx: PhaseContext,
    parser: CallStreamParser | None,
    cut: bool,
    word: str | None,
    schema: dict[str, Any] | None,
    said: str,
    tools: Sequence[ToolSpec],
) -> AsyncIterator[EngineEvent]:
    """The answer's end: a cut answer's last deltas, what makes its JSON whole (closing.py;
    worked out in a thread, as a schema's pattern may take a search), then the finish."""
    reason: FinishReason = "stop"
    if cut:
        reason = "length"
        if parser is not None:
            for delta in parser.feed(await asyncio.to_thread(close_call, parser, tools)):
                yield delta
        elif schema is not None and (text := await asyncio.to_thread(close_answer, said, ctx.request, schema)):
            yield ContentDelta(text)
    elif parser is not None and parser.count:
        reason = "tool_calls"
    yield ctx.finish(reason, word)
