"""Generation phases on top of raw completions: reasoning first, then the answer.

All calls of one request run on the same llama.cpp slot and extend the same prompt, so the
answer phase reuses the KV cache of the reasoning phase and costs only the new tokens. That
reuse is inside one request and always on; whether the *first* call may reuse KV left by earlier
requests is the prompt cache's decision (``PhaseContext.reuse``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from kimi_server.engines.llamacpp.answer import AnswerPlan
from kimi_server.engines.llamacpp.consensus import most_agreed
from kimi_server.engines.llamacpp.decide import (
    just_answered,
    model_wants_call,
    reasoning_writes_call,
)
from kimi_server.engines.llamacpp.multimodal import prompt_field
from kimi_server.engines.llamacpp.repetition import RepetitionGuard, RepetitionLimits
from kimi_server.engines.llamacpp.runner import CompletionResult, CompletionRunner
from kimi_server.engines.llamacpp.template import ChatTemplate
from kimi_server.engines.llamacpp.toolcalls import CallStreamParser
from kimi_server.engines.types import (
    ContentDelta,
    EngineEvent,
    Finish,
    FinishReason,
    GenerationRequest,
    Message,
    ReasoningDelta,
    Usage,
)
from kimi_server.errors import InvalidRequestError
from kimi_server.parsers.reasoning import MarkerScrub, PhraseScrub, ReasoningFormat


@dataclass
class Tally:
    """Token counts across the calls that make up one request."""

    prompt: int = 0
    cached: int = 0
    completion: int = 0
    reasoning: int = 0
    calls: int = 0
    # What the slot holds after the last call: its prompt plus what it generated.
    held_text: str = ""
    held_tokens: int = 0
    # The prompt was computed in turns before the first call (prefill.py): what the slot held
    # before them is the request's cache hit, not what the first call finds.
    cache_hit: int | None = None

    def add(self, result: CompletionResult, prompt: str, *, reasoning: bool) -> None:
        if self.calls == 0:
            self.prompt, self.cached = result.prompt_tokens, result.cached_tokens
            if self.cache_hit is not None:
                self.cached = min(self.cached, self.cache_hit)
        self.calls += 1
        self.completion += result.completion_tokens
        if reasoning:
            self.reasoning += result.completion_tokens
        self.held_text = prompt + result.text
        self.held_tokens = result.prompt_tokens + result.completion_tokens

    def usage(self, request: GenerationRequest, *, written: bool = True) -> Usage:
        """``written``: the prompt stayed in the prompt cache. kimi-k3 never separates writes
        (they bill as regular input), and a prompt the cache did not keep wrote nothing."""
        separate = written and request.cache.separate_writes
        written_tokens = self.prompt - self.cached if separate else 0
        return Usage(
            prompt_tokens=self.prompt,
            cached_tokens=self.cached,
            cache_write_tokens=written_tokens,
            completion_tokens=self.completion,
            reasoning_tokens=self.reasoning,
        )


async def _no_answer_prompt(reasoning: str) -> str:
    raise RuntimeError("prompted reasoning needs the engine's answer_prompt")


def answer_turn(
    template: ChatTemplate,
    request: GenerationRequest,
    fmt: ReasoningFormat,
    history: tuple[str, str] | None = None,
) -> Callable[[str], Awaitable[str]]:
    """The answer's prompt for prompted reasoning: the conversation, then the chosen attempt as
    a draft in a system turn of its own, rendered by the model's own template (in a worker
    thread: a long conversation must not stall the event loop). The conversation stays a
    prefix, so the answer reuses the attempts' KV and the prompt cache still holds it. A
    template that refuses a system turn there gets the draft as a user turn."""

    def render(reasoning: str) -> str:
        note = fmt.follow_up.format(draft=reasoning)
        try:
            turns = (*request.messages, Message("system", note))
            return template.render(turns, tools=request.tools, history_reasoning=history)
        except InvalidRequestError:
            turns = (*request.messages, Message("user", note))
            return template.render(turns, tools=request.tools, history_reasoning=history)

    async def in_thread(reasoning: str) -> str:
        return await asyncio.to_thread(render, reasoning)

    return in_thread


@dataclass
class PhaseContext:
    runner: CompletionRunner
    request: GenerationRequest
    fmt: ReasoningFormat
    sampling: dict[str, Any]
    slot: int | None = None  # the llama.cpp slot leased for this request
    reuse: bool = True  # may the first call reuse KV that earlier requests left in the slot
    # Records the slot's content in the prompt cache; returns whether the prompt stayed cached.
    settle: Callable[[Tally], bool] | None = None
    utility_slot: int | None = None  # for side calls that must not touch the request's slot
    tally: Tally = field(default_factory=Tally)
    # The engine's context ran out, or a call looped (repetition.py): nothing more is generated.
    context_full: bool = False
    media: tuple[str, ...] = ()
    context_window: int = 0  # the engine's ctx_size, for error messages
    # The answer's prompt, given the chosen attempt (prompted reasoning; see answer_turn).
    answer_prompt: Callable[[str], Awaitable[str]] = field(default=_no_answer_prompt)
    repetition: RepetitionLimits | None = None  # ends a call that loops (repetition.py)

    def body(self, prompt: str, n_predict: int, *, attempt: int = 0, **extra: Any) -> dict[str, Any]:
        body: dict[str, Any] = {
            "prompt": prompt_field(prompt, self.media),
            "n_predict": n_predict,
            # Later calls always extend this request's own KV; the first only when allowed.
            "cache_prompt": self.reuse or self.tally.calls > 0,
            **self.sampling,
            **extra,
        }
        if self.slot is not None:
            body["id_slot"] = self.slot
        if self.request.seed is not None:
            # Each attempt its own stream of the seed: the same seed would repeat one attempt.
            body["seed"] = (self.request.seed + attempt) % 2**32 if attempt else self.request.seed
        return body

    def finish(self, reason: FinishReason) -> Finish:
        written = self.settle(self.tally) if self.settle is not None else True
        return Finish(reason, self.tally.usage(self.request, written=written))


class LeadingTrim:
    """Drops the whitespace a phase starts with (models often open with a newline)."""

    def __init__(self) -> None:
        self.started = False

    def __call__(self, text: str) -> str:
        if not self.started:
            text = text.lstrip()
            self.started = bool(text)
        return text


async def _call(
    ctx: PhaseContext, body: dict[str, Any], *, reasoning: bool
) -> AsyncIterator[str | CompletionResult]:
    if ctx.context_full:
        return
    limits = ctx.repetition
    if limits is not None and limits.enabled:
        stream = ctx.runner.stream(body, RepetitionGuard(limits).looping)
    else:
        stream = ctx.runner.stream(body)
    try:
        async for item in stream:
            if isinstance(item, CompletionResult):
                text = body["prompt"]
                text = text if isinstance(text, str) else text["prompt_string"]
                ctx.tally.add(item, text, reasoning=reasoning)
                # "length" before n_predict means the context ran out; a call the repetition
                # guard cut ends the request too. Either way nothing more is generated.
                if item.cut or (item.finish_reason == "length" and item.completion_tokens < body["n_predict"]):
                    ctx.context_full = True
            yield item
    except InvalidRequestError as exc:
        if exc.code != "context_length_exceeded":
            raise
        if ctx.tally.calls == 0:
            # The client's own prompt does not fit: name the field it came in.
            raise InvalidRequestError(
                f"The prompt is longer than this model's context window "
                f"({ctx.context_window} tokens) allows.",
                param=ctx.request.prompt_param,
                code="context_length_exceeded",
            ) from None
        # A continuation that no longer fits: the request's output is cut at the context end.
        ctx.context_full = True


def open_thinking(prompt: str, fmt: ReasoningFormat) -> str:
    """The prompt with the thinking block opened (once: some templates open it themselves)."""
    if prompt.rstrip().endswith(fmt.opener.strip()):
        return prompt
    return prompt + fmt.opener


# Answer tokens during which end-of-turn and think tags are masked, so no answer is empty; every
# attempt after the first starts the same way, so each says something and the loop advances.
ANSWER_LEAD = 3
OPEN_TAG_BANS: list[list[Any]] = [[f"{lead}<", False] for lead in ("", " ", "\n")]


def reasoning_cap(ctx: PhaseContext) -> int:
    return min(ctx.request.budget.cap, ctx.request.max_output_tokens)


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
    while not ctx.context_full and ctx.tally.reasoning < cap and (
        index == 0 or ctx.tally.reasoning < floor
    ):
        if index:
            yield ReasoningDelta(f"\n\nAttempt {index + 1}:\n")
        raw: list[str] = []
        parts: list[str] = []
        trim = LeadingTrim()
        finished = False
        spent = ctx.tally.reasoning
        # The first attempt is one plain call: exactly the model's direct reply (with a seed,
        # the one a direct call with that seed gives), so the reasoning can only add to it.
        stages = ((cap, {}),) if index == 0 else ((ANSWER_LEAD, lead), (cap, {}))
        for limit, extra in stages:
            left = min(limit, cap - ctx.tally.reasoning)
            if finished or left <= 0 or ctx.context_full:
                break
            body = ctx.body(prompt + "".join(raw), left, stop=stop, attempt=index, **extra)
            async for item in _call(ctx, body, reasoning=True):
                if isinstance(item, CompletionResult):
                    finished = item.finish_reason == "stop"  # end-of-turn or a marker
                    continue
                raw.append(item)
                if text := trim(item):
                    parts.append(text)
                    yield ReasoningDelta(text)
        tokens = ctx.tally.reasoning - spent
        yield Attempt("".join(parts), finished, tuple(raw), tokens)
        index += 1


async def native_reasoning(ctx: PhaseContext, opened: str) -> AsyncIterator[ReasoningDelta | str]:
    """A model that thinks natively decides itself when it is done, up to the cap. Yields the
    deltas, then the whole reasoning text (a plain str)."""
    parts: list[str] = []
    trim = LeadingTrim()
    cap = reasoning_cap(ctx)
    if cap > 0:
        body = ctx.body(opened, cap, stop=list(ctx.fmt.markers))
        async for item in _call(ctx, body, reasoning=True):
            if not isinstance(item, CompletionResult) and (text := trim(item)):
                parts.append(text)
                yield ReasoningDelta(text)
    yield "".join(parts)


async def answer(
    ctx: PhaseContext, prompt: str, extra: dict[str, Any], *, stops: bool = True
) -> AsyncIterator[str | CompletionResult]:
    remaining = ctx.request.max_output_tokens - ctx.tally.completion
    if not stops:
        async for item in _call(ctx, ctx.body(prompt, remaining, **extra), reasoning=False):
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
    async for item in _call(ctx, body, reasoning=False):
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
    async for item in _call(ctx, body, reasoning=False):
        yield item


async def chosen_as_answer(
    ctx: PhaseContext, prompt: str, chosen: Attempt, index: int
) -> AsyncIterator[EngineEvent]:
    """The chosen attempt given as the answer (free text under no grammar), continued where the
    cap cut it. It is the model's own reply to the conversation, and the one the other attempts
    agree with. Rewritten in a turn of its own it was measured to lose answers: the
    model commented on its draft ("Sure! Here's the draft of your reply:") or changed a right
    result. Its tokens count again as output, so that ``completion_tokens - reasoning_tokens``
    is the answer's length, as a client counts it."""
    room = ctx.request.max_output_tokens - ctx.tally.completion
    count = min(chosen.tokens, max(room, 0))
    ctx.tally.completion += count
    scrub = MarkerScrub(ctx.fmt.markers)
    trim = LeadingTrim()
    # A stream piece is about one token; only a cap below the attempt's length cuts it.
    for piece in chosen.pieces[:count]:
        if text := trim(scrub.feed(piece)):
            yield ContentDelta(text)
    cut = count < chosen.tokens
    unfinished = not chosen.finished and not cut  # the reasoning cap stopped it
    if unfinished and (ctx.context_full or count == room):
        cut = True  # no room left to finish it
    elif unfinished:
        stop = [*ctx.fmt.markers, *ctx.request.stop]
        body = ctx.body(prompt + chosen.raw, room - count, stop=stop, attempt=index)
        async for item in _call(ctx, body, reasoning=False):
            if isinstance(item, CompletionResult):
                cut = item.finish_reason == "length"
            elif text := trim(scrub.feed(item)):
                yield ContentDelta(text)
    if text := trim(scrub.flush()):
        yield ContentDelta(text)
    yield ctx.finish("length" if cut else "stop")


async def prompted_generation(
    ctx: PhaseContext, prompt: str, plan: AnswerPlan
) -> AsyncIterator[EngineEvent]:
    # Under tool_choice auto the decision step runs alongside the reasoning (see decide.py).
    decision: asyncio.Task[bool] | None = None
    if plan.decide == "model":
        decision = asyncio.create_task(
            model_wants_call(ctx.runner, ctx.request, plan.tools, slot=ctx.utility_slot)
        )
    try:
        async for event in _generate(ctx, prompt, plan, decision):
            yield event
    finally:
        if decision is not None and not decision.done():
            decision.cancel()


async def _generate(
    ctx: PhaseContext, prompt: str, plan: AnswerPlan, decision: asyncio.Task[bool] | None
) -> AsyncIterator[EngineEvent]:
    opened = open_thinking(prompt, ctx.fmt)
    if not ctx.request.reasoning:
        # Switched off by the client: the answer follows the conversation at once (after an
        # empty thinking block for a model that thinks natively).
        reasoning = ""
    elif ctx.fmt.kind == "prompted":
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
        reasoning = ""
        if whole:
            pick = whole[most_agreed([tried[i].text for i in whole])]
            if len(tried) > 1:
                yield ReasoningDelta(f"\n\nGoing with attempt {pick + 1}.")
            if as_answer and tried[pick].text.strip():
                async for event in chosen_as_answer(ctx, prompt, tried[pick], pick):
                    yield event
                return
            # Otherwise the answer builds on it as a draft, from its finished lines only.
            reasoning = settled(tried[pick].text, cut=not tried[pick].finished)
    else:
        reasoning = ""
        async for step in native_reasoning(ctx, opened):
            if isinstance(step, str):
                reasoning = settled(step, cut=ctx.tally.reasoning >= reasoning_cap(ctx))
            else:
                yield step
    if ctx.context_full or ctx.tally.completion >= ctx.request.max_output_tokens:
        yield ctx.finish("length")
        return
    answered = just_answered(ctx.request)
    if ctx.fmt.kind == "prompted":
        # No draft worth showing (every attempt blank), or the conversation ends in tool
        # results (a draft there was seen to copy them, or to call again, rather than use them):
        # the answer is the model's own reply to the conversation.
        drafted = bool(reasoning.strip()) and not answered
        full = await ctx.answer_prompt(reasoning) if drafted else prompt
    else:
        full = opened + reasoning + ctx.fmt.closer
    mode = plan.decide
    if decision is not None:
        wants = await decision or reasoning_writes_call(
            reasoning, plan.tools, plan.syntax, answered
        )
        mode = "calls" if wants else "text"
    grammar = plan.calls if mode == "calls" else plan.text
    extra = {"grammar": grammar.text()} if grammar is not None else {}
    parser = CallStreamParser(plan.syntax) if mode == "calls" else None
    trim = LeadingTrim()
    truncated = False
    # Stop sequences would cut JSON or a call short of parsing; they only apply to text. Under
    # a grammar, marker text is scrubbed from the stream instead (it can only sit in a string).
    stops = grammar is None or grammar.free_text
    scrub = MarkerScrub(ctx.fmt.markers)
    # Free text only: JSON or a call never holds the draft's framing sentences.
    framing = PhraseScrub(ctx.fmt.scaffold if parser is None and stops else ())
    async for piece in answer(ctx, full, extra, stops=stops):
        if isinstance(piece, CompletionResult):
            truncated = piece.finish_reason == "length"
            piece = framing.feed(scrub.flush()) + framing.flush()
        else:
            piece = framing.feed(scrub.feed(piece))
        if not piece:
            continue
        if parser is None:
            if text := trim(piece):
                yield ContentDelta(text)
        else:
            for delta in parser.feed(piece):
                yield delta
    reason_: FinishReason = "stop"
    if truncated or ctx.context_full:
        reason_ = "length"
    elif parser is not None and parser.count:
        reason_ = "tool_calls"
    yield ctx.finish(reason_)
