"""``tool_choice`` "required" or a named function on an upstream said to keep it itself: checked,
not trusted. Some servers take the field and answer text anyway (llama.cpp's under many chat
templates, any compatible API that ignores it), and a forced choice must end in a call or an
error, whatever the dialect.

Reasoning streams as it comes; text is held back until a call (of the named function, for a
named choice) shows that the answer is one, then follows in order. An answer that ends without
the call is not shown: the upstream is asked once more, for a JSON answer under a schema only a
call satisfies (``forced_calls``), with its reasoning switched off if the client has already
seen some. An upstream that cannot take a JSON Schema, or a second answer that is no call
either, ends in a 502 ``upstream_no_tool_call``. Both answers' tokens are counted: both were
generated for the request.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing

from kimi_server.engines.types import EngineEvent, Finish, GenerationRequest, ReasoningDelta, ToolCallDelta
from kimi_server.engines.upstream.errors import MissingToolCallError
from kimi_server.engines.upstream.relay import Failure

log = logging.getLogger(__name__)

# The second attempt: its events, given whether the client has seen reasoning already.
Fallback = Callable[[bool], AsyncGenerator[EngineEvent, None]]

_warned: set[str] = set()  # upstreams whose first miss was logged at warning level


def missing_call() -> Failure:
    return Failure(
        MissingToolCallError("The model's engine did not answer with the required tool call."),
        retry=False,
        failover=False,
        counts=False,
    )


class CallGuard:
    """What the first answer has shown: held-back text, whether the call came, its Finish."""

    def __init__(self, req: GenerationRequest) -> None:
        self.name = req.tool_choice.name if req.tool_choice.mode == "named" else None
        self.held: list[EngineEvent] = []
        self.called = False
        self.reasoned = False
        self.finish: Finish | None = None

    def step(self, event: EngineEvent) -> list[EngineEvent]:
        """What of the first answer goes out now."""
        if self.called:
            return [event]
        if type(event) is ReasoningDelta:
            self.reasoned = True
            return [event]
        if isinstance(event, Finish):
            self.finish = event  # withheld: the answer is no call
        elif isinstance(event, ToolCallDelta) and event.name is not None and self.name in (None, event.name):
            self.called = True
            held, self.held = self.held, []
            return [*held, event]
        else:
            self.held.append(event)
        return []


async def checked_call(
    events: AsyncGenerator[EngineEvent, None], req: GenerationRequest, upstream: str, fallback: Fallback | None
) -> AsyncGenerator[EngineEvent, None]:
    guard = CallGuard(req)
    async with aclosing(events) as first:
        async for event in first:
            for out in guard.step(event):
                yield out
    if guard.called or guard.finish is None:
        return
    if fallback is None:
        raise missing_call()
    _log_miss(upstream)
    withheld = guard.finish.usage
    async with aclosing(fallback(guard.reasoned)) as second:
        async for event in second:
            if isinstance(event, Finish):
                yield Finish(event.reason, withheld + event.usage)
            elif not (guard.reasoned and type(event) is ReasoningDelta):
                yield event


def _log_miss(upstream: str) -> None:
    level = logging.DEBUG if upstream in _warned else logging.WARNING
    _warned.add(upstream)
    log.log(
        level,
        "upstream %s answered a forced tool_choice without the call; asked again under a JSON Schema "
        '(capabilities.forced_tool_calls = "json_schema" asks that way at once)',
        upstream,
    )
