"""The reasoning step of a request: prompted attempts (a model with no thinking mode) or one
native thinking call, ending in what the answer step builds on (``Reasoned``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

from kimi_server.engines.llamacpp.answer import AnswerPlan
from kimi_server.engines.llamacpp.consensus import most_agreed
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
    an attempt may become the answer).
    """
    cap = reasoning_cap(ctx)
    floor = min(ctx.request.budget.floor, cap)
    # The lead masks end-of-turn and tags, so each later attempt costs at least one token.
    lead = {"ignore_eos": True, "logit_bias": [*OPEN_TAG_BANS, *([t, False] for t in ctx.fmt.stops)]}
    stop = [*ctx.fmt.markers, *stops]
    index = 0
    while not ctx.reasoning_ended and ctx.tally.reasoning < cap and (index == 0 or ctx.tally.reasoning < floor):
        if index:
            yield ReasoningDelta(f"\n\nAttempt {index + 1}:\n")
        raw: list[str] = []
        parts: list[str] = []
        trim = LeadingTrim()
        finished = looped = False
        word: str | None = None
        spent = ctx.tally.reasoning
        # The first attempt is one plain call: exactly the model's direct reply (with a seed,
        # the one a direct call with that seed gives), so the reasoning can only add to it.
        stages = ((cap, {}),) if index == 0 else ((ANSWER_LEAD, lead), (cap, {}))
        for limit, extra in stages:
            left = min(limit, cap - ctx.tally.reasoning)
            if finished or left <= 0 or ctx.reasoning_ended:
                break
            body = ctx.body(prompt + "".join(raw), left, stop=stop, attempt=index, **extra)
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
        tokens = ctx.tally.reasoning - spent
        yield Attempt("".join(parts), finished, tuple(raw), tokens, word, looped)
        index += 1


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
