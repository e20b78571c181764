"""What every call of one request shares: its slot, sampling and token tally (``PhaseContext``),
and the one way to make a llama.cpp call (``call``).

All calls of one request run on the same llama.cpp slot and extend the same prompt, so the
answer reuses the KV cache of the reasoning and costs only the new tokens. That reuse is inside
one request and always on; whether the *first* call may reuse KV left by earlier requests is the
prompt cache's decision (``PhaseContext.reuse``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kimi_server.engines.llamacpp.multimodal import prompt_field
from kimi_server.engines.llamacpp.repetition import RepetitionGuard, RepetitionLimits
from kimi_server.engines.llamacpp.runner import CompletionResult, CompletionRunner
from kimi_server.engines.llamacpp.template import ChatTemplate
from kimi_server.engines.types import Finish, FinishReason, GenerationRequest, Message, Usage
from kimi_server.errors import InvalidRequestError
from kimi_server.parsers.reasoning import ReasoningFormat

if TYPE_CHECKING:
    from kimi_server.engines.llamacpp.extra_attempts import SpareSlots


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
    # The engine's context ran out, or the answer looped (repetition.py): nothing more is generated.
    context_full: bool = False
    # The reasoning looped: it ends there, and the answer still comes (a forced call included).
    reasoning_looped: bool = False
    looped: bool = False  # it was the repetition guard
    media: tuple[str, ...] = ()
    context_window: int = 0  # the engine's ctx_size, for error messages
    # The answer's prompt, given the chosen attempt (prompted reasoning; see answer_turn).
    answer_prompt: Callable[[str], Awaitable[str]] = field(default=_no_answer_prompt)
    repetition: RepetitionLimits | None = None  # ends a call that loops (repetition.py)
    # Free slots this request may borrow to decode reasoning attempts together (extra_attempts.py).
    spare: SpareSlots | None = None
    # Output tokens the reasoning leaves for an answer decoded under a grammar (answer_room).
    answer_room: int = 0
    # Partial Mode: what the answer's prompt ends with, the text it continues (answer_prefix.py).
    lead: str = ""

    @property
    def reasoning_ended(self) -> bool:
        """No more reasoning: the context is full or the reasoning looped."""
        return self.context_full or self.reasoning_looped

    @property
    def continues(self) -> bool:
        """The answer continues the client's own text: its first whitespace is its own."""
        prefix = self.request.answer_prefix
        return prefix is not None and bool(prefix.text)

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
        if self.request.stop and not set(self.request.stop).isdisjoint(extra.get("stop", ())):
            # llama.cpp names the stop string that ended a call only in its verbose result:
            # asked for where a client's stop strings may end it (a Messages stop_sequence).
            body["verbose"] = True
        if self.request.seed is not None:
            # Each attempt its own stream of the seed: the same seed would repeat one attempt.
            body["seed"] = (self.request.seed + attempt) % 2**32 if attempt else self.request.seed
        return body

    def finish(self, reason: FinishReason, stopping_word: str | None = None) -> Finish:
        """``stopping_word``: the stop string llama.cpp says ended the answer; reported only
        when it is one of the client's (the reasoning markers stop calls too)."""
        written = self.settle(self.tally) if self.settle is not None else True
        matched = stopping_word if reason == "stop" and stopping_word in self.request.stop else None
        usage = self.tally.usage(self.request, written=written)
        return Finish(reason, usage, matched, looped=self.looped and reason == "length")


class LeadingTrim:
    """Drops the whitespace a phase starts with (models often open with a newline)."""

    def __init__(self, *, keep: bool = False) -> None:
        self.started = keep  # keep: nothing to drop (an answer that continues a prefix)

    def __call__(self, text: str) -> str:
        if not self.started:
            text = text.lstrip()
            self.started = bool(text)
        return text


async def call(ctx: PhaseContext, body: dict[str, Any], *, reasoning: bool) -> AsyncIterator[str | CompletionResult]:
    if ctx.context_full:
        return
    limits = ctx.repetition
    guard = RepetitionGuard(limits) if limits is not None and limits.enabled else None
    stream = ctx.runner.stream(body, guard.looping) if guard is not None else ctx.runner.stream(body)
    try:
        async for item in stream:
            if isinstance(item, CompletionResult):
                text = body["prompt"]
                text = text if isinstance(text, str) else text["prompt_string"]
                ctx.tally.add(item, text, reasoning=reasoning)
                # "length" before n_predict means the context ran out; an answer the repetition
                # guard cut ends the request too. Either way nothing more is generated. Looping
                # reasoning only ends the reasoning: the answer (a required call) must still come.
                if item.looped and reasoning:
                    ctx.reasoning_looped = True
                elif item.cut or (item.finish_reason == "length" and item.completion_tokens < body["n_predict"]):
                    ctx.context_full = True
                    ctx.looped = ctx.looped or (guard is not None and guard.looped)
            yield item
    except InvalidRequestError as exc:
        if exc.code != "context_length_exceeded":
            raise
        if ctx.tally.calls == 0:
            # The client's own prompt does not fit: name the field it came in.
            raise InvalidRequestError(
                f"The prompt is longer than this model's context window ({ctx.context_window} tokens) allows.",
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


# The most a grammar-bound answer keeps back from the reasoning: a call or a small JSON object
# fits in far less; a larger one gets what the reasoning does not use.
ANSWER_ROOM_MAX = 256


def answer_room(max_output_tokens: int, *, constrained: bool) -> int:
    """Output tokens kept for the answer. A call or a structured answer cut short by the output
    cap is worth nothing (no call, JSON that does not parse), so the reasoning may use at most
    half of a small cap; free text can stop anywhere and keeps nothing back."""
    return min(max_output_tokens // 2, ANSWER_ROOM_MAX) if constrained else 0


def reasoning_cap(ctx: PhaseContext) -> int:
    return min(ctx.request.budget.cap, ctx.request.max_output_tokens - ctx.answer_room)
