"""Messages output: engine events -> the stream's events and the final Message object.

One builder produces both: ``complete`` runs the same sequence as ``stream`` and returns the
object it built, so the two can never disagree. Events are (name, data) pairs, written as SSE
``event: <name>`` / ``data: <json>`` by the HTTP layer (which also adds ``ping``):
``message_start``, then each content block's ``content_block_start`` / ``_delta`` / ``_stop``,
``message_delta`` (stop reason and the final usage), ``message_stop``. A failure after the first
event ends the stream with an ``error`` event, as Anthropic streams one.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

from kimi_server.engines.base import AsyncStream
from kimi_server.engines.types import ContentDelta, EngineEvent, Finish, ReasoningDelta, ToolCallDelta, Usage
from kimi_server.errors import APIError, InternalServerError
from kimi_server.logsafe import log_failure
from kimi_server.serving.common import new_id, stopped_by
from kimi_server.serving.messages_blocks import ContentBlocks, Event
from kimi_server.serving.messages_errors import anthropic_error
from kimi_server.serving.messages_request import MessagesPlan
from kimi_server.serving.primed import prime
from kimi_server.serving.sealing import Sealer

log = logging.getLogger(__name__)
__all__ = ["Event", "MessageBuilder", "complete", "stream", "usage_dict"]


def usage_dict(usage: Usage, plan: MessagesPlan) -> dict[str, Any]:
    """Anthropic's accounting: ``input_tokens`` is the prompt neither read from nor written to
    the cache; the three add up to the prompt. Cache writes are all at the request's TTL."""
    cached, written = usage.cached_tokens, usage.cache_write_tokens
    long = plan.gen.cache.ttl_label == "1h"
    out: dict[str, Any] = {
        "input_tokens": max(usage.prompt_tokens - cached - written, 0),
        "cache_creation_input_tokens": written,
        "cache_read_input_tokens": cached,
        "cache_creation": {
            "ephemeral_5m_input_tokens": 0 if long else written,
            "ephemeral_1h_input_tokens": written if long else 0,
        },
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"thinking_tokens": usage.reasoning_tokens},
    }
    if plan.web_search is not None:
        out["server_tool_use"] = {"web_search_requests": usage.web_search_calls, "web_fetch_requests": 0}
    return out


def _stop_reason(finish: Finish, calls: bool) -> tuple[str, str | None]:
    if finish.reason == "length":
        return "max_tokens", None
    if calls:
        return "tool_use", None
    if finish.stop_sequence is not None:
        return "stop_sequence", finish.stop_sequence
    return "end_turn", None


class MessageBuilder(ContentBlocks):
    def __init__(self, plan: MessagesPlan, sealer: Sealer, *, prompt_tokens: int | None = None) -> None:
        super().__init__(plan, sealer)
        self.id = new_id("msg_")
        self.prompt_tokens = prompt_tokens  # the prompt as counted before generating, if it was
        self.final: dict[str, Any] | None = None
        self.error: Exception | None = None

    def message(self, *, stop_reason: str | None, stop_sequence: str | None, usage: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.plan.model,
            "content": list(self.blocks),
            "stop_reason": stop_reason,
            "stop_sequence": stop_sequence,
            "usage": usage,
        }

    # --- the event sequence -------------------------------------------------------------------

    async def run(self, events: AsyncStream[EngineEvent]) -> AsyncGenerator[Event, None]:
        # The engine's first event comes before anything is yielded: a request it refuses is
        # still a plain HTTP error, not an error event.
        events = await prime(events)
        yield self.start()
        async with aclosing(self.run_answer(events)) as answer:
            async for out in answer:
                yield out

    def start(self) -> Event:
        """``message_start``: the usage known so far (the prompt, when it was counted)."""
        usage = usage_dict(Usage(prompt_tokens=self.prompt_tokens or 0), self.plan)
        message = self.message(stop_reason=None, stop_sequence=None, usage=usage)
        return ("message_start", {"type": "message_start", "message": message})

    async def run_answer(self, events: AsyncStream[EngineEvent]) -> AsyncGenerator[Event, None]:
        """Thinking, text and tool_use blocks from the engine's events, then the end."""
        try:
            async with aclosing(events):
                async for event in events:
                    for out in self._on(event):
                        yield out
            if self.final is None:
                raise RuntimeError("the engine stopped without a Finish event")
        except Exception as exc:
            yield self.fail(exc)

    def _on(self, event: EngineEvent) -> list[Event]:
        if isinstance(event, ReasoningDelta):
            return self.reasoning_delta(event.text)
        if isinstance(event, ContentDelta):
            return self.content_delta(event.text)
        if isinstance(event, ToolCallDelta):
            return self.call_delta(event)
        return self._finish(event)

    def _finish(self, finish: Finish) -> list[Event]:
        cut = finish.reason == "length"
        out = [] if cut else self.text_if_empty()
        out += self.close_all(cut=cut)
        stop_reason, stop_sequence = _stop_reason(finish, bool(self.calls))
        usage = usage_dict(finish.usage, self.plan)
        delta = {"stop_reason": stop_reason, "stop_sequence": stop_sequence, **stopped_by(finish)}
        out.append(("message_delta", {"type": "message_delta", "delta": delta, "usage": usage}))
        out.append(("message_stop", {"type": "message_stop"}))
        self.final = self.message(stop_reason=stop_reason, stop_sequence=stop_sequence, usage=usage)
        self.final.update(stopped_by(finish))
        return out

    async def result(self, run: AsyncGenerator[Event, None]) -> dict[str, Any]:
        """Drains ``run`` (this builder's): the final Message, or its failure raised."""
        async with aclosing(run):
            async for _ in run:
                pass
        if self.error is not None:
            raise self.error
        assert self.final is not None, "every run ends with message_stop or an error"
        return self.final

    def fail(self, exc: Exception) -> Event:
        """The ``error`` event that ends a failed stream. An APIError's message is safe to show
        (errors.py); anything else is logged and shown as a plain server error."""
        self.error = exc
        if isinstance(exc, APIError):
            return ("error", anthropic_error(exc)[1])
        log_failure(log, "message generation failed", exc)
        self.error = InternalServerError("The server had an error while generating the response.")
        return ("error", anthropic_error(self.error)[1])


async def complete(
    plan: MessagesPlan, sealer: Sealer, events: AsyncStream[EngineEvent], *, prompt_tokens: int | None = None
) -> dict[str, Any]:
    """The Message object; a failure raises (an APIError) for the HTTP layer to answer."""
    builder = MessageBuilder(plan, sealer, prompt_tokens=prompt_tokens)
    return await builder.result(builder.run(events))


def stream(
    plan: MessagesPlan, sealer: Sealer, events: AsyncStream[EngineEvent], *, prompt_tokens: int | None = None
) -> AsyncGenerator[Event, None]:
    return MessageBuilder(plan, sealer, prompt_tokens=prompt_tokens).run(events)
