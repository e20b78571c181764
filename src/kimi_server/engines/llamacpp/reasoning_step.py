"""The reasoning step of a request: prompted attempts (a model with no thinking mode) or one
native thinking call, ending in what the answer step builds on (``Reasoned``)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any

from kimi_server.engines.llamacpp.answer import AnswerPlan
from kimi_server.engines.llamacpp.consensus import most_agreed
from kimi_server.engines.llamacpp.extra_attempts import (
    Extra,
    LentSlots,
    RunAttempt,
    extra_room,
    extras_wanted,
    finish,
    in_turn,
    prune,
    start_extras,
)
from kimi_server.engines.llamacpp.phase_context import (
    ANSWER_LEAD,
    OPEN_TAG_BANS,
    LeadingTrim,
    PhaseContext,
    call,
    reasoning_cap,
)
from kimi_server.engines.llamacpp.runner import CompletionResult
from kimi_server.engines.types import ReasoningDelta


def settled(reasoning: str, *, cut: bool) -> str:
    """The reasoning the answer is conditioned on. Cut off by the cap, its last line is
    unfinished ("17 x 23 = 39" of 391) and would be copied into the answer as it stands, so the
    answer sees only the finished lines."""
    if cut and not reasoning.endswith("\n") and "\n" in reasoning:
        reasoning = reasoning.rsplit("\n", 1)[0]
    return reasoning.rstrip()


@dataclass
class Attempt:
    text: str  # as shown in the reasoning, leading whitespace trimmed
    finished: bool  # ended by the model, not cut by the cap or the context
    pieces: tuple[str, ...] = ()  # as generated and streamed, about one token each
    tokens: int = 0
    stopping_word: str | None = None  # the stop string that ended it, where llama.cpp said
    looped: bool = False  # the repetition guard ended it

    @property
    def raw(self) -> str:
        """As generated: the prompt it continues from is ``prompt + raw``."""
        return "".join(self.pieces)


async def attempts(
    ctx: PhaseContext, prompt: str, stops: tuple[str, ...] = ()
) -> AsyncIterator[ReasoningDelta | Attempt]:
    """The prompted reasoning phase: independent attempts at the reply, each sampled from the
    conversation itself, until the effort's floor is reached (never past its cap).

    A model with no thinking mode answers best in the form it was trained on; asked to "think"
    first it drifts, and the longer it is made to think the further (forced reasoning
    made the 0.5B default model wrong more often than answering directly). More attempts, by
    contrast, only add evidence: ``consensus.most_agreed`` picks the one the others agree with.
    Yields the reasoning deltas, with a label before every attempt after the first, and each
    attempt once it ends. ``stops``: more sequences that end an attempt (the client's own, when
    an attempt may become the answer). Where slots are free, the attempts that would come next
    decode alongside (extra_attempts.py); what is shown and counted is the same series.
    """
    cap = reasoning_cap(ctx)
    floor = min(ctx.request.budget.floor, cap)
    stop = [*ctx.fmt.markers, *stops]

    def run(on: PhaseContext, seed_offset: int, room: int) -> AsyncGenerator[ReasoningDelta | Attempt, None]:
        return one_attempt(on, prompt, seed_offset, room, stop)

    count = launched = 0  # attempts shown; attempts started (each its own seed offset)
    pool = LentSlots(ctx.spare) if ctx.spare is not None else None
    try:
        while not ctx.reasoning_ended and ctx.tally.reasoning < cap and (count == 0 or ctx.tally.reasoning < floor):
            spent = ctx.tally.reasoning
            extras: list[Extra] = []
            if pool is not None:
                wanted = extras_wanted(pool.spare, floor, spent, count)
                extras = start_extras(ctx, pool, run, launched + 1, wanted, extra_room(cap, floor, spent))
            async for item in _round(ctx, run, extras, count, launched, cap, floor):
                count += not isinstance(item, ReasoningDelta)
                yield item
            launched += 1 + len(extras)
    finally:
        if pool is not None:
            pool.close()


async def _round(
    ctx: PhaseContext, run: RunAttempt, extras: list[Extra], count: int, own_seed: int, cap: int, floor: int
) -> AsyncIterator[ReasoningDelta | Attempt]:
    """One attempt on the request's own slot, with ``extras`` decoding alongside on lent
    slots, shown in turn after it."""
    spent = ctx.tally.reasoning
    try:
        if count:
            yield ReasoningDelta(f"\n\nAttempt {count + 1}:\n")
        pieces = 0
        async for item in run(ctx, own_seed, cap - spent):
            if isinstance(item, ReasoningDelta):
                pieces += 1
                prune(extras, spent + pieces, floor)
            yield item
        async for item in in_turn(ctx, extras, floor, count + 1):
            yield item
    finally:
        finish(extras)


async def one_attempt(
    ctx: PhaseContext, prompt: str, seed_offset: int, room: int, stop: list[str]
) -> AsyncGenerator[ReasoningDelta | Attempt, None]:
    """One attempt on ``ctx``'s slot, at most ``room`` tokens: its deltas, then the Attempt.
    ``seed_offset`` 0 is the first attempt: one plain call, exactly the model's direct reply
    (with a seed, the one a direct call with that seed gives), so the reasoning can only add to
    it. Every later one starts with a lead that masks end-of-turn and tags, so it costs at least
    one token."""
    lead = {"ignore_eos": True, "logit_bias": [*OPEN_TAG_BANS, *([t, False] for t in ctx.fmt.stops)]}
    raw: list[str] = []
    parts: list[str] = []
    trim = LeadingTrim()
    finished = looped = False
    word: str | None = None
    spent = ctx.tally.reasoning
    stages: tuple[tuple[int, dict[str, Any]], ...] = (
        ((room, {}),) if seed_offset == 0 else ((ANSWER_LEAD, lead), (room, {}))
    )
    for limit, extra in stages:
        left = min(limit, room - (ctx.tally.reasoning - spent))
        if finished or left <= 0 or ctx.reasoning_ended:
            break
        body = ctx.body(prompt + "".join(raw), left, stop=stop, attempt=seed_offset, **extra)
        async for item in call(ctx, body, reasoning=True):
            if isinstance(item, CompletionResult):
                finished = item.finish_reason == "stop"  # end-of-turn or a marker
                word = item.stopping_word
                looped = looped or item.looped
                continue
            raw.append(item)
            if text := trim(item):
                parts.append(text)
                yield ReasoningDelta(text)
    yield Attempt("".join(parts), finished, tuple(raw), ctx.tally.reasoning - spent, word, looped)


async def native_reasoning(ctx: PhaseContext, opened: str) -> AsyncIterator[ReasoningDelta | str]:
    """A model that thinks natively decides itself when it is done, up to the cap. Yields the
    deltas, then the whole reasoning text (a plain str)."""
    parts: list[str] = []
    trim = LeadingTrim()
    cap = reasoning_cap(ctx)
    if cap > 0:
        body = ctx.body(opened, cap, stop=list(ctx.fmt.markers))
        async for item in call(ctx, body, reasoning=True):
            if not isinstance(item, CompletionResult) and (text := trim(item)):
                parts.append(text)
                yield ReasoningDelta(text)
    yield "".join(parts)


@dataclass(frozen=True)
class Reasoned:
    """What the reasoning step ends with: the reasoning the answer is conditioned on, or the
    chosen attempt that is itself the answer (``index``: its place among the attempts)."""

    text: str = ""
    chosen: Attempt | None = None
    index: int = 0


async def reasoning_step(
    ctx: PhaseContext, prompt: str, opened: str, plan: AnswerPlan
) -> AsyncIterator[ReasoningDelta | Reasoned]:
    """Yields the reasoning deltas, then one ``Reasoned``. ``opened``: the prompt with the
    thinking block opened, for a model that thinks natively."""
    if not ctx.request.reasoning:
        # Switched off by the client: the answer follows the conversation at once (after an
        # empty thinking block for a model that thinks natively).
        yield Reasoned()
    elif ctx.fmt.kind == "prompted":
        async for item in _prompted(ctx, prompt, plan):
            yield item
    else:
        async for step in native_reasoning(ctx, opened):
            if isinstance(step, str):
                yield Reasoned(settled(step, cut=ctx.tally.reasoning >= reasoning_cap(ctx)))
            else:
                yield step


async def _prompted(ctx: PhaseContext, prompt: str, plan: AnswerPlan) -> AsyncIterator[ReasoningDelta | Reasoned]:
    # Free text under no grammar: the chosen attempt is itself the answer, so the attempts
    # end where the answer would, at the client's stop sequences too.
    as_answer = plan.decide == "text" and plan.text is None
    tried: list[Attempt] = []
    async for item in attempts(ctx, prompt, tuple(ctx.request.stop) if as_answer else ()):
        if isinstance(item, Attempt):
            tried.append(item)
        else:
            yield item
    # The one the others agree with; one cut short only counts when there is no other.
    whole = [i for i, a in enumerate(tried) if a.finished] or ([0] if tried else [])
    if not whole:
        yield Reasoned()
        return
    pick = whole[most_agreed([tried[i].text for i in whole])]
    if len(tried) > 1:
        yield ReasoningDelta(f"\n\nGoing with attempt {pick + 1}.")
    if as_answer and tried[pick].text.strip():
        yield Reasoned(chosen=tried[pick], index=pick)
        return
    # Otherwise the answer builds on it as a draft, from its finished lines only.
    yield Reasoned(settled(tried[pick].text, cut=not tried[pick].finished))
