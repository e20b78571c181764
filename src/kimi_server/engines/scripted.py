"""A scripted engine: replays a fixed script of events. Used by the HTTP/contract unit tests
and handy for client development without a model (``engine = "scripted"`` is not exposed to
users; tests build it directly)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field

from kimi_server.engines.types import (
    ContentDelta,
    EngineEvent,
    Finish,
    FinishReason,
    GenerationRequest,
    ReasoningDelta,
    ToolCallDelta,
    Usage,
)


@dataclass
class Script:
    reasoning: tuple[str, ...] = ("Let me ", "think.")
    content: tuple[str, ...] = ("Hello", " there.")
    tool_calls: tuple[ToolCallDelta, ...] = ()
    prompt_tokens: int = 12
    cached_tokens: int = 0
    fail_after: int | None = None  # raise after this many events
    stop_sequence: str | None = None  # the client's stop string the answer "hit" (reason "stop")
    delay: float = 0.0
    looped: bool = False  # a "length" ending is the repetition guard's, not the cap's


@dataclass
class ScriptedEngine:
    script: Script = field(default_factory=Script)
    images: bool = False
    name: str = "scripted"
    window: int = 32768
    requests: list[GenerationRequest] = field(default_factory=list)
    cancelled: int = 0
    on_generate: Callable[[GenerationRequest], None] | None = None

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def accepts_images(self) -> bool:
        return self.images

    def context_length(self) -> int:
        return self.window

    def concurrency(self) -> None:
        return None

    def tenant_stats(self, key_id: str) -> dict[str, int]:
        return {"active_calls": 0, "cancelled_calls": 0}  # scripted runs count no tenants

    def stats(self) -> dict[str, int]:
        return {"active_calls": 0, "cancelled_calls": self.cancelled}

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[EngineEvent, None]:
        self.requests.append(request)
        if self.on_generate is not None:
            self.on_generate(request)
        s = self.script
        # A request with reasoning switched off gets the script's answer only.
        thought = s.reasoning if request.reasoning else ()
        events: list[EngineEvent] = [ReasoningDelta(t) for t in thought]
        budget = request.max_output_tokens
        reasoning_tokens = min(len(thought), budget)
        events = events[:reasoning_tokens]
        answer_budget = budget - reasoning_tokens
        answer: list[EngineEvent] = [ContentDelta(t) for t in s.content[:answer_budget]]
        events += answer
        events += list(s.tool_calls)
        completion = reasoning_tokens + len(answer) + len(s.tool_calls)
        truncated = answer_budget < len(s.content)
        reason: FinishReason = "length" if truncated else ("tool_calls" if s.tool_calls else "stop")
        written = s.prompt_tokens - s.cached_tokens if request.cache.separate_writes else 0
        usage = Usage(s.prompt_tokens, s.cached_tokens, written, completion, reasoning_tokens)
        events.append(Finish(reason, usage, s.stop_sequence if reason == "stop" else None, s.looped and truncated))
        try:
            for n, event in enumerate(events):
                if s.fail_after is not None and n >= s.fail_after:
                    raise RuntimeError("scripted failure")
                if s.delay:
                    await asyncio.sleep(s.delay)
                yield event
        except (GeneratorExit, asyncio.CancelledError):
            self.cancelled += 1
            raise
