"""Generation phases on top of raw completions: reasoning first, then the answer.

All calls of one request run on the same llama.cpp slot and extend the same prompt, so the
answer phase reuses the KV cache of the reasoning phase and costs only the new tokens. That
reuse is inside one request and always on; whether the *first* call may reuse KV left by earlier
requests is the prompt cache's decision (``PhaseContext.reuse``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from kimi_server.engines.llamacpp.answer import AnswerPlan
from kimi_server.engines.llamacpp.decide import model_wants_call, reasoning_writes_call
from kimi_server.engines.llamacpp.multimodal import prompt_field
from kimi_server.engines.llamacpp.runner import CompletionResult, CompletionRunner
from kimi_server.engines.llamacpp.toolcalls import CallStreamParser
from kimi_server.engines.types import (
    ContentDelta,
    EngineEvent,
    Finish,
    FinishReason,
    GenerationRequest,
    ReasoningDelta,
    Usage,
)
from kimi_server.errors import InvalidRequestError
from kimi_server.parsers.reasoning import MarkerScrub, ReasoningFormat


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

    def add(self, result: CompletionResult, prompt: str, *, reasoning: bool) -> None:
        if self.calls == 0:
            self.prompt, self.cached = result.prompt_tokens, result.cached_tokens
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
    context_full: bool = False  # the engine's context ran out: nothing more can be generated
    media: tuple[str, ...] = ()  # base64 images for a multimodal model (issue 11)
    context_window: int = 0  # the engine's ctx_size, for error messages

    def body(self, prompt: str, n_predict: int, **extra: Any) -> dict[str, Any]:
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
            body["seed"] = self.request.seed
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
    try:
        async for item in ctx.runner.stream(body):
            if isinstance(item, CompletionResult):
                text = body["prompt"]
                text = text if isinstance(text, str) else text["prompt_string"]
                ctx.tally.add(item, text, reasoning=reasoning)
                # "length" before n_predict means the context, not the budget, ran out.
                if item.finish_reason == "length" and item.completion_tokens < body["n_predict"]:
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


# Answer tokens during which end-of-turn and think tags are masked, so no answer is empty.
ANSWER_LEAD = 3


def floor_bans(fmt: ReasoningFormat) -> list[list[Any]]:
    """Tokens banned while the floor lasts: the ones that open a closing tag ("</"), however
    the tokenizer splits it after a space or a newline."""
    starts = {m[:2] for m in fmt.markers if m.startswith("</")}
    return [[f"{lead}{s}", False] for s in sorted(starts) for lead in ("", " ", "\n")]


def reasoning_cap(ctx: PhaseContext) -> int:
    return min(ctx.request.budget.cap, ctx.request.max_output_tokens)


def settled(reasoning: str, *, cut: bool) -> str:
    """The reasoning the answer is conditioned on. Cut off by the cap, its last line is
    unfinished ("17 x 23 = 39" of 391) and would be copied into the answer as it stands, so the
    answer sees only the finished lines."""
    if cut and not reasoning.endswith("\n") and "\n" in reasoning:
        reasoning = reasoning.rsplit("\n", 1)[0]
    return reasoning.rstrip()


BLANK_RETRY = 4  # tokens asked for at a time while the floor's reasoning is still blank
OPEN_TAG_BANS: list[list[Any]] = [[f"{lead}<", False] for lead in ("", " ", "\n")]


async def reason(ctx: PhaseContext, opened: str) -> AsyncIterator[ReasoningDelta | str]:
    """Runs the reasoning phase; yields deltas, then the whole reasoning text (a plain str).

    The floor holds: end-of-turn is masked and the closing tag's first token banned; should the
    model still spell a marker out, the marker is dropped and the thinking goes on from the text
    before it. Each call generates at least one token, so the loop ends within ``floor`` calls.
    After the floor the model may close its reasoning (or stop) until the cap.
    """
    budget = ctx.request.budget
    cap = reasoning_cap(ctx)
    # A model that thinks natively decides itself when it is done; only prompted ones get a floor.
    floor = min(budget.floor, cap) if ctx.fmt.kind == "prompted" else 0
    stop = list(ctx.fmt.markers)  # the model starting an answer also ends its reasoning
    parts: list[str] = []
    raw: list[str] = []  # untrimmed, to extend the prompt exactly as the KV cache holds it
    trim = LeadingTrim()
    bans = floor_bans(ctx.fmt)
    # The floor counts only once something was said: a floor spent on blank lines would leave
    # the reasoning empty (seen on a fresh server with the tiny model at `low`).
    while (
        not ctx.context_full
        and ctx.tally.reasoning < cap
        and (ctx.tally.reasoning < floor or (floor > 0 and not parts))
    ):
        short = floor - ctx.tally.reasoning
        left = min(short if short > 0 else BLANK_RETRY, cap - ctx.tally.reasoning)
        # Until something is said, no tag may open either: a model that starts its thinking
        # with "<answer>" would otherwise stop at that marker every time and say nothing.
        ban = bans if parts else [*bans, *OPEN_TAG_BANS]
        body = ctx.body(opened + "".join(raw), left, stop=stop, ignore_eos=True, logit_bias=ban)
        async for item in _call(ctx, body, reasoning=True):
            if isinstance(item, CompletionResult):
                continue
            raw.append(item)
            if text := trim(item):
                parts.append(text)
                yield ReasoningDelta(text)
    remaining = cap - ctx.tally.reasoning
    if remaining > 0 and not ctx.context_full:
        body = ctx.body(opened + "".join(raw), remaining, stop=stop)
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
    reasoning = ""
    opened = open_thinking(prompt, ctx.fmt)
    async for item in reason(ctx, opened):
        if isinstance(item, str):
            reasoning = item
        else:
            yield item
    if ctx.context_full or ctx.tally.completion >= ctx.request.max_output_tokens:
        yield ctx.finish("length")
        return
    full = opened + settled(reasoning, cut=ctx.tally.reasoning >= reasoning_cap(ctx)) + ctx.fmt.closer
    mode = plan.decide
    if decision is not None:
        wants = await decision or reasoning_writes_call(reasoning, plan.tools, plan.syntax)
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
    async for piece in answer(ctx, full, extra, stops=stops):
        if isinstance(piece, CompletionResult):
            truncated = piece.finish_reason == "length"
            piece = scrub.flush()
        else:
            piece = scrub.feed(piece)
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
