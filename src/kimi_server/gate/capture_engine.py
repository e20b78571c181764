"""The engine of a request whose prompt and answer are captured: it passes every event on
unchanged and keeps the reasoning, the text and the tool calls; when a call ends, however it
ends, the capture is written off the request (``captures.py``). Only requests of keys or teams
that capture are wrapped, so the others pay nothing."""

from __future__ import annotations

from collections.abc import AsyncGenerator

from kimi_server.engines.base import Engine
from kimi_server.engines.types import (
    ContentDelta,
    EngineEvent,
    GenerationRequest,
    ReasoningDelta,
    ToolCallDelta,
)
from kimi_server.gate.captures import Capture, CaptureStore


class CapturingEngine:
    def __init__(self, inner: Engine, store: CaptureStore, request_id: str, key_id: str) -> None:
        self.inner = inner
        self.name = inner.name
        self._store = store
        self._request_id = request_id
        self._key_id = key_id
        self._capture: Capture | None = None

    async def start(self) -> None:
        await self.inner.start()

    async def close(self) -> None:
        await self.inner.close()

    def accepts_images(self) -> bool:
        return self.inner.accepts_images()

    def stats(self) -> dict[str, int]:
        return self.inner.stats()

    def context_length(self) -> int | None:
        return self.inner.context_length()

    def concurrency(self) -> int | None:
        return self.inner.concurrency()

    def tenant_stats(self, key_id: str) -> dict[str, int]:
        return self.inner.tenant_stats(key_id)

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[EngineEvent, None]:
        capture = self._capture
        if capture is None:  # the first call: its messages are the prompt as the client sent it
            capture = self._capture = self._store.start(self._request_id, self._key_id, request.messages)
        events = self.inner.generate(request)
        try:
            async for event in events:
                _keep(capture, event)
                yield event
        finally:
            await events.aclose()
            self._store.spawn(self._store.save(capture))


def _keep(capture: Capture, event: EngineEvent) -> None:
    if isinstance(event, ContentDelta):
        capture.answer.append(event.text)
    elif isinstance(event, ReasoningDelta):
        capture.reasoning.append(event.text)
    elif isinstance(event, ToolCallDelta):
        call = capture.tool_calls.setdefault(event.index, {"id": "", "name": "", "arguments": ""})
        if event.id:
            call["id"] = event.id
        if event.name:
            call["name"] = event.name
        call["arguments"] += event.arguments
