"""Responses output: engine events -> the streaming event sequence and the response object.

One builder produces both: a non-streaming call runs the same sequence and returns the object
the final event carries, so the two can never disagree. Output order is reasoning, message,
tool calls; every event has a strictly increasing ``sequence_number``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

from kimi_server.engines.base import AsyncStream
from kimi_server.engines.types import (
    ContentDelta,
    EngineEvent,
    Finish,
    ReasoningDelta,
    ToolCallDelta,
)
from kimi_server.errors import APIError
from kimi_server.logsafe import log_failure
from kimi_server.serving.common import new_id, now, stopped_by
from kimi_server.serving.responses_items import Event, OutputItems
from kimi_server.serving.responses_object import response_object, usage_dict
from kimi_server.serving.responses_request import ResponsesPlan
from kimi_server.serving.sealing import Sealer

log = logging.getLogger(__name__)
__all__ = ["Event", "ResponseBuilder", "complete", "failed_events", "stream"]


class ResponseBuilder(OutputItems):
    def __init__(self, plan: ResponsesPlan, sealer: Sealer) -> None:
        super().__init__(plan, sealer)
        self.id = new_id("resp_")
        self.created_at = now()
        self.final: dict[str, Any] | None = None

    # --- the response object ------------------------------------------------------------------

    def response(self, status: str, **fields: Any) -> dict[str, Any]:
        output = [self.items[i] for i in sorted(self.items)]
        return response_object(self.id, self.created_at, status, self.plan, output=output, **fields)

    # --- the event sequence -------------------------------------------------------------------

    async def run(self, events: AsyncStream[EngineEvent]) -> AsyncGenerator[Event, None]:
        for out in self._start():
            yield out
        async with aclosing(self.run_answer(events)) as answer:
            async for out in answer:
                yield out

    def _start(self) -> list[Event]:
        return [
            self._event("response.created", response=self.response("in_progress")),
            self._event("response.in_progress", response=self.response("in_progress")),
        ]

    async def run_answer(self, events: AsyncStream[EngineEvent]) -> AsyncGenerator[Event, None]:
        """Reasoning, message and calls from the engine's events (after any web search items)."""
        for out in self._open_reasoning():
            yield out
        try:
            async with aclosing(events):
                async for event in events:
                    for out in self._on(event):
                        yield out
            if self.final is None:
                raise RuntimeError("the engine stopped without a Finish event")
        except Exception as exc:
            for out in self._fail(exc):
                yield out

    def _on(self, event: EngineEvent) -> list[Event]:
        if isinstance(event, ReasoningDelta):
            return self._reasoning_delta(event.text)
        if isinstance(event, ContentDelta):
            return self._content_delta(event.text)
        if isinstance(event, ToolCallDelta):
            return self._call_delta(event)
        return self._finish(event)

    def _finish(self, finish: Finish) -> list[Event]:
        cut = finish.reason == "length"
        status = "incomplete" if cut else "completed"
        out: list[Event] = []
        if not cut and self.message is None and not self.calls:
            out += self._content_delta("")  # a completed response always carries its answer
        out += self._close_all(status)
        fields: dict[str, Any] = {"completed_at": now(), "usage": usage_dict(finish.usage)}
        if cut:
            fields["incomplete_details"] = {"reason": "max_output_tokens", **stopped_by(finish)}
        self.final = self.response(status, **fields)
        out.append(self._event(f"response.{status}", response=self.final))
        return out

    def _fail(self, exc: Exception) -> list[Event]:
        if isinstance(exc, APIError) and exc.status_code < 500:
            error = {"code": exc.code or "invalid_request", "message": exc.message}
        else:
            log_failure(log, "response generation failed", exc)
            error = {
                "code": "server_error",
                "message": "The server had an error while generating the response.",
            }
        try:
            out = self._close_all("incomplete")
        except Exception:  # pragma: no cover - never let closing hide the failure
            log.exception("closing output items failed")
            out = []
        self.final = self.response("failed", error=error)
        out.append(self._event("response.failed", response=self.final))
        return out


async def complete(plan: ResponsesPlan, sealer: Sealer, events: AsyncStream[EngineEvent]) -> dict[str, Any]:
    builder = ResponseBuilder(plan, sealer)
    async for _ in builder.run(events):
        pass
    assert builder.final is not None, "every run ends with a terminal event"
    return builder.final


def failed_events(plan: ResponsesPlan, sealer: Sealer, exc: BaseException) -> list[Event]:
    """The whole sequence of a response that failed before the engine's first event."""
    builder = ResponseBuilder(plan, sealer)
    failure = exc if isinstance(exc, Exception) else RuntimeError("the generation was stopped")
    return [*builder._start(), *builder._fail(failure)]


def stream(plan: ResponsesPlan, sealer: Sealer, events: AsyncStream[EngineEvent]) -> AsyncGenerator[Event, None]:
    return ResponseBuilder(plan, sealer).run(events)
