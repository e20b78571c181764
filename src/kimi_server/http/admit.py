"""The one step a generating route takes before the engine: the key's limits, then its turn.

The prompt is measured first (its size, then its tokens counted by the engine's own tokenizer:
a 400 at once for what cannot fit). The gateway then reserves the key's requests,
tokens (that count) and budget, so a key over its limits is refused at once and never holds a
place in the queue; then the request waits for a fair turn at the engine. A
reservation whose request never reaches the engine is given back. What comes back is the
engine to call: metered when the gateway is on.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from typing import Any

from fastapi import Request

from kimi_server.engines.base import Engine
from kimi_server.engines.types import GenerationRequest
from kimi_server.gate.auth import Principal
from kimi_server.gate.gateway import MeteredEngine
from kimi_server.http.overload import admit, measure_prompt
from kimi_server.http.state import app_state


async def admit_request(
    request: Request,
    principal: Principal,
    engine: Engine,
    gen: GenerationRequest,
    *,
    endpoint: str,
    param: str,
    searches: int = 0,
) -> Engine:
    """``searches``: web searches the server already ran for this request (billed with it)."""
    gateway = app_state(request).gateway
    if gateway is not None:
        gateway.check_model(principal, gen.model)  # a model the key may not use: 404 first
    # The prompt's size (400s) and its real token count, before anything is reserved.
    prompt_tokens = await measure_prompt(request, engine, gen, param=param)
    if gateway is None:
        await admit(request, principal, engine, gen, param=param)
        return engine
    ticket = await gateway.admit(request, principal, gen, endpoint, prompt_tokens=prompt_tokens)
    try:
        await admit(request, principal, engine, gen, param=param)
    except BaseException:
        gateway.refund(ticket)
        raise
    return gateway.metered(engine, ticket, request, searches=searches)


TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})


class Rounds:
    """Metering for a request that calls the engine several times (the Responses web-search
    rounds): one ledger row, written before the terminal event, with the searches it ran."""

    def __init__(self, engine: Engine, searches: Callable[[], int]) -> None:
        self._metered = engine if isinstance(engine, MeteredEngine) else None
        self._searches = searches
        if self._metered is not None:
            self._metered.deferred = True

    async def commit(self) -> None:
        if self._metered is not None:
            await self._metered.commit(self._searches())

    def abandon(self) -> None:
        if self._metered is not None:
            self._metered.abandon(self._searches())

    async def events(self, events: AsyncIterator[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
        try:
            async with aclosing(events):  # type: ignore[type-var]
                async for event in events:
                    if event.get("type") in TERMINAL:
                        await self.commit()
                    yield event
        finally:
            self.abandon()
