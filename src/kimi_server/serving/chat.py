"""Chat Completions output: engine events -> a completion object or a stream of chunks."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from kimi_server.engines.base import AsyncStream
from kimi_server.engines.types import (
    ContentDelta,
    EngineEvent,
    Finish,
    GenerationRequest,
    ReasoningDelta,
    ToolCallDelta,
    Usage,
)
from kimi_server.serving.common import new_id, now, stopped_by


def usage_dict(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {
            "cached_tokens": usage.cached_tokens,
            "cache_write_tokens": usage.cache_write_tokens,
        },
        "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
    }


@dataclass
class _CallAccumulator:
    calls: dict[int, dict[str, Any]] = field(default_factory=dict)

    def add(self, delta: ToolCallDelta) -> None:
        call = self.calls.setdefault(
            delta.index,
            {"id": delta.id, "type": delta.kind, "function": {"name": delta.name, "arguments": ""}},
        )
        if delta.id:
            call["id"] = delta.id
        if delta.name:
            call["function"]["name"] = delta.name
        call["function"]["arguments"] += delta.arguments

    def result(self) -> list[dict[str, Any]]:
        return [self.calls[i] for i in sorted(self.calls)]


async def complete(events: AsyncStream[EngineEvent], request: GenerationRequest) -> dict[str, Any]:
    reasoning: list[str] = []
    content: list[str] = []
    calls = _CallAccumulator()
    finish: Finish | None = None
    async for event in events:
        if isinstance(event, ReasoningDelta):
            reasoning.append(event.text)
        elif isinstance(event, ContentDelta):
            content.append(event.text)
        elif isinstance(event, ToolCallDelta):
            calls.add(event)
        else:
            finish = event
    assert finish is not None, "engines always end with Finish"
    message: dict[str, Any] = {
        "role": "assistant",
        "content": "".join(content) if content or not calls.calls else None,
    }
    # Absent, not empty, when the client switched reasoning off (as Moonshot answers then).
    if request.reasoning:
        message["reasoning_content"] = "".join(reasoning)
    if calls.calls:
        message["tool_calls"] = calls.result()
    return {
        "id": new_id("chatcmpl-"),
        "object": "chat.completion",
        "created": now(),
        "model": request.model,
        "choices": [
            {"index": 0, "message": message, "finish_reason": finish.reason, "logprobs": None, **stopped_by(finish)}
        ],
        "usage": usage_dict(finish.usage),
    }


class ChunkBuilder:
    """A stream's chunk objects: one envelope (id, created, model) for all of them."""

    def __init__(self, model: str, *, include_usage: bool) -> None:
        self.include_usage = include_usage
        self.base = {
            "id": new_id("chatcmpl-"),
            "object": "chat.completion.chunk",
            "created": now(),
            "model": model,
        }

    def chunk(self, delta: dict[str, Any], finish_reason: str | None = None, **extra: str) -> dict[str, Any]:
        out = {
            **self.base,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None, **extra}],
        }
        if self.include_usage:
            out["usage"] = None
        return out

    def first(self) -> dict[str, Any]:
        return self.chunk({"role": "assistant"})

    def chunks(self, event: EngineEvent) -> list[dict[str, Any]]:
        if isinstance(event, ReasoningDelta):
            return [self.chunk({"reasoning_content": event.text})]
        if isinstance(event, ContentDelta):
            return [self.chunk({"content": event.text})]
        if isinstance(event, ToolCallDelta):
            call: dict[str, Any] = {"index": event.index}
            if event.id is not None:
                call.update(id=event.id, type=event.kind)
            fn: dict[str, Any] = {"arguments": event.arguments}
            if event.name is not None:
                fn["name"] = event.name
            call["function"] = fn
            return [self.chunk({"tool_calls": [call]})]
        if isinstance(event, Finish):
            out = [self.chunk({}, event.reason, **stopped_by(event))]
            if self.include_usage:
                out.append({**self.base, "choices": [], "usage": usage_dict(event.usage)})
            return out
        return []


async def stream_chunks(
    events: AsyncIterator[EngineEvent], model: str, *, include_usage: bool
) -> AsyncGenerator[dict[str, Any], None]:
    """Chunk objects in order; the caller frames them as SSE and appends ``[DONE]``."""
    builder = ChunkBuilder(model, include_usage=include_usage)
    yield builder.first()
    async for event in events:
        for chunk in builder.chunks(event):
            yield chunk
