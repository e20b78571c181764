"""The one admission pass a generation takes before the engine: the prompt's size, the key's
limits, then its turn in the engine's queue; what comes back is the engine to call (metered
when the gateway is on) and the queue place to give back when the request ends.

The prompt is measured first (its size, then its tokens counted by the engine's own tokenizer:
a 400 at once for what cannot fit). The gateway then reserves the key's requests, tokens (that
count) and budget, so a key over its limits is refused at once and never holds a place in the
queue; then the request waits for a fair turn at the engine. A reservation whose request never
reaches the engine is given back.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from kimi_server.engines.base import Engine, PromptCounter
from kimi_server.engines.owner import current_owner
from kimi_server.engines.types import GenerationRequest
from kimi_server.gate.admission import QueuePlace
from kimi_server.gate.auth import Principal
from kimi_server.gate.gateway import Gateway
from kimi_server.gate.queues import AdmissionSet
from kimi_server.gate.request_record import RequestRecord
from kimi_server.policy.prompt_size import check_prompt_size, check_prompt_tokens

T = TypeVar("T")


class ClientLink(Protocol):
    """The caller's connection, for work that must stop when nobody waits for its answer."""

    async def until_gone(self, work: Awaitable[T], discard: Callable[[T], object] | None = None) -> T:
        """Awaits ``work``; if the client leaves first, cancels it and raises ``ClientGone``.
        ``discard`` gets a result that arrived anyway, in the same instant."""
        ...


@dataclass(frozen=True)
class Caller:
    """Who asks: the key the guard checked, the request's record, and its connection."""

    principal: Principal
    record: RequestRecord
    link: ClientLink


@dataclass
class Admitted:
    """A request let through: the engine to call and its place in the engine's queue."""

    engine: Engine  # metered where the gateway is on
    prompt_tokens: int | None  # the engine's own count of the prompt; None: it cannot count
    place: QueuePlace

    def release(self) -> None:
        """Gives the place back (once): the response has ended, or the client left."""
        self.place.release()


async def admit(
    caller: Caller,
    engine: Engine,
    gen: GenerationRequest,
    *,
    queues: AdmissionSet,
    gateway: Gateway | None,
    endpoint: str,
    searches: int = 0,
) -> Admitted:
    """``endpoint``: the ledger's name of the door; ``searches``: web searches the server already
    ran for this request (billed with it)."""
    principal = caller.principal
    if gateway is not None:
        gateway.check_model(principal, gen.model)  # a model the key may not use: 404 first
    prompt_tokens = await measure_prompt(queues, engine, gen)
    if gateway is None:
        return Admitted(engine, prompt_tokens, await take_turn(caller, queues, engine))
    window = engine.context_length()
    reservation = await gateway.reserve(
        caller.record, principal, gen, endpoint, prompt_tokens=prompt_tokens, window=window
    )
    try:
        place = await take_turn(caller, queues, engine)
    except BaseException:
        gateway.refund(reservation)
        raise
    if reservation.capture:  # the key or its team keeps prompts and answers: off by default
        engine = gateway.captured(engine, reservation)
    metered = gateway.metered(engine, reservation, caller.record, searches=searches)
    return Admitted(metered, prompt_tokens, place)


async def measure_prompt(queues: AdmissionSet, engine: Engine, gen: GenerationRequest) -> int | None:
    """The prompt's size, checked before the request reserves or waits for anything: first the
    cheap bound on messages, parts and characters (nothing tokenized, so a huge body costs
    little), then the engine's own token count (400s naming the numbers). Returns that count;
    None for an engine that cannot count (sized by characters only)."""
    limits = queues.prompt_limits(engine)
    check_prompt_size(gen, limits, param=gen.prompt_param)
    if not isinstance(engine, PromptCounter):
        return None
    tokens = await engine.count_prompt_tokens(gen)
    if tokens is not None:
        check_prompt_tokens(tokens, gen, limits, bound=engine.prompt_token_limit(), param=gen.prompt_param)
    return tokens


async def take_turn(caller: Caller, queues: AdmissionSet, engine: Engine) -> QueuePlace:
    """A fair turn at the engine, for a request whose size ``measure_prompt`` checked."""
    key_id = caller.principal.key_id
    current_owner.set(key_id)  # per-tenant engine counters (engines/owner.py)
    queue = queues.for_engine(engine)
    place = queue.admit_now(key_id)  # a free place: no waiting, no watcher task
    if place is None:
        # A client that leaves while waiting gives its place back (nothing else would notice).
        place = await caller.link.until_gone(queue.admit(key_id), discard=QueuePlace.release)
    return place
