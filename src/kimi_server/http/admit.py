"""The one step a generating route takes before the engine (``admit_request``): the prompt's
size, the key's limits, then its turn in the engine's queue.

The prompt is measured first (its size, then its tokens counted by the engine's own tokenizer:
a 400 at once for what cannot fit). The gateway then reserves the key's requests,
tokens (that count) and budget, so a key over its limits is refused at once and never holds a
place in the queue; then the request waits for a fair turn at the engine. A
reservation whose request never reaches the engine is given back. What comes back is the
engine to call: metered when the gateway is on.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from typing import Any

from fastapi import Request

from kimi_server.engines.base import AsyncStream, Engine, PromptCounter
from kimi_server.engines.owner import current_owner
from kimi_server.engines.types import GenerationRequest
from kimi_server.gate.admission import Ticket
from kimi_server.gate.auth import Principal
from kimi_server.gate.metering import MeteredEngine
from kimi_server.gate.ticket import request_record
from kimi_server.http.disconnect import until_disconnected
from kimi_server.http.guard import TICKETS
from kimi_server.http.overload import admission_set
from kimi_server.http.state import app_state
from kimi_server.policy.prompt_size import check_prompt_size, check_prompt_tokens


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
        await take_turn(request, principal, engine)
        return engine
    record = request_record(request.scope)
    ticket = await gateway.reserve(record, principal, gen, endpoint, prompt_tokens=prompt_tokens)
    try:
        await take_turn(request, principal, engine)
    except BaseException:
        gateway.refund(ticket)
        raise
    return gateway.metered(engine, ticket, request, searches=searches)


async def measure_prompt(request: Request, engine: Engine, gen: GenerationRequest, *, param: str) -> int | None:
    """The prompt's size, checked before the request reserves or waits for anything: first the
    cheap bound on messages, parts and characters (nothing tokenized, so a huge body costs
    little), then the engine's own token count (400s naming the numbers). Returns that count;
    None for an engine that cannot count (sized by characters only)."""
    limits = admission_set(request.app).prompt_limits(engine)
    check_prompt_size(gen, limits, param=param)
    if not isinstance(engine, PromptCounter):
        return None
    tokens = await engine.count_prompt_tokens(gen)
    if tokens is not None:
        check_prompt_tokens(tokens, gen, limits, bound=engine.prompt_token_limit(), param=param)
    return tokens


async def take_turn(request: Request, principal: Principal, engine: Engine) -> Ticket:
    """A fair turn at the engine, for a request whose size ``measure_prompt`` checked. The guard
    releases the ticket at the end of the request (response sent, stream ended or client gone);
    ``ticket.release()`` may do it sooner."""
    tickets: list[Ticket] | None = request.scope.get(TICKETS)
    if tickets is None:
        raise RuntimeError("OverloadGuard is not installed")
    current_owner.set(principal.key_id)  # per-tenant engine counters (engines/owner.py)
    queue = admission_set(request.app).for_engine(engine)
    ticket = queue.admit_now(principal.key_id)  # a free place: no waiting, no watcher task
    if ticket is None:
        # A client that leaves while waiting gives its place back (nothing else would notice).
        ticket = await until_disconnected(request, queue.admit(principal.key_id), discard=Ticket.release)
    tickets.append(ticket)
    return ticket


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

    async def events(self, events: AsyncStream[dict[str, Any]]) -> AsyncGenerator[dict[str, Any], None]:
        try:
            async with aclosing(events):
                async for event in events:
                    if event.get("type") in TERMINAL:
                        await self.commit()
                    yield event
        finally:
            self.abandon()
