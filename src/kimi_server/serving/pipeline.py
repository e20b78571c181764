"""The one generation pipeline every door goes through.

A door's router parses its wire format and makes one call here; its ``Front`` (one per wire
format: Chat Completions, Responses, Messages) turns the body into a plan (the internal
``GenerationRequest`` and what the output needs) and the engine's events back into its own
output. Between the two, the steps are the same for every door, in this order:

1. the plan, under the contract's rules (``Front.plan``: 400s and 404s name the field);
2. every image and video checked, and fetched where the operator allows (``media/intake.py``);
3. work the server does before generating (chat's ``$web_search`` results: ``Front.prepare``);
4. one admission pass (``gate/admit.py``): the prompt's size, the key's limits, a fair turn;
5. the engine called, metered; the front builds the answer or the stream.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Generic, Protocol, TypeVar, cast

from kimi_server.engines.base import AsyncStream, Engine, PromptAsker, PromptCounter
from kimi_server.engines.types import EngineEvent, GenerationRequest
from kimi_server.gate.admit import Admitted, Caller, admit
from kimi_server.media import intake as media_intake
from kimi_server.media.intake import Part
from kimi_server.policy.output_caps import output_defaults
from kimi_server.policy.profiles import ContractProfile, contracts
from kimi_server.policy.prompt_size import estimate_prompt_tokens
from kimi_server.serving.services import Services


class Plan(Protocol):
    @property
    def gen(self) -> GenerationRequest: ...


BodyT = TypeVar("BodyT", contravariant=True)
PlanT = TypeVar("PlanT", bound=Plan)
PlanT_co = TypeVar("PlanT_co", bound=Plan, covariant=True)


@dataclass(frozen=True)
class PlanContext:
    """What a front needs to check a body against this server and this caller."""

    services: Services
    key_id: str
    accepts_images: bool  # the engine of the model the body names takes images
    output_defaults: Mapping[str, int]  # the output cap of a request that names none
    contracts: Mapping[str, ContractProfile]

    @property
    def served(self) -> frozenset[str]:
        return self.services.engines.served()


@dataclass
class Run(Generic[PlanT]):
    """An admitted request: its plan, the engine to call (metered) and the place it holds."""

    plan: PlanT
    admitted: Admitted
    services: Services

    @property
    def engine(self) -> Engine:
        return self.admitted.engine

    def events(self) -> AsyncStream[EngineEvent]:
        """The engine's events for the plan's request (its first call)."""
        return self.admitted.engine.generate(self.plan.gen)

    def release(self) -> None:
        self.admitted.release()


class Planner(Protocol[BodyT, PlanT_co]):
    """What turns one wire format's body into a plan (a door's front, or a counting route's)."""

    def model(self, body: BodyT, services: Services) -> str:
        """The served model id the body names (whether its engine takes images decides a 400);
        an id this server does not serve as it is (a 404 later)."""
        ...

    def plan(self, body: BodyT, context: PlanContext) -> PlanT_co: ...

    def media_parts(self, body: BodyT) -> list[Part]:
        """Every image and video part, named as the client wrote it."""
        ...


class Front(Planner[BodyT, PlanT], Protocol[BodyT, PlanT]):
    """One wire format's side of the pipeline."""

    endpoint: str  # the door's name in the ledger and the metrics

    async def prepare(self, plan: PlanT, services: Services) -> tuple[PlanT, int]:
        """Work the server does before admission; the plan, and the web searches it ran."""
        ...

    async def complete(self, run: Run[PlanT]) -> dict[str, Any]:
        """The whole answer."""
        ...

    def stream(self, run: Run[PlanT]) -> AsyncStream[Any]:
        """The answer's stream items. Its first item comes only once the engine has answered
        (the caller awaits it before sending anything, so a request the engine refuses is
        still a plain HTTP error)."""
        ...


def with_gen(plan: PlanT, gen: GenerationRequest) -> PlanT:
    """The plan with another internal request (every plan is a frozen dataclass with ``gen``)."""
    return cast(PlanT, replace(cast(Any, plan), gen=gen))


class Pipeline:
    def __init__(self, services: Services) -> None:
        self.services = services

    def context(self, front: Planner[BodyT, PlanT], body: BodyT, caller: Caller) -> PlanContext:
        services = self.services
        named = front.model(body, services)
        engines = services.engines
        engine = engines.for_model(named) if named in engines.served() else None
        principal = caller.principal
        return PlanContext(
            services=services,
            key_id=principal.key_id,
            accepts_images=engine.accepts_images() if engine is not None else False,
            output_defaults=output_defaults(services.settings, principal.output_cap),
            contracts=contracts(services.settings),
        )

    async def plan(self, front: Planner[BodyT, PlanT], body: BodyT, caller: Caller) -> PlanT:
        """Steps 1-2: the plan, its media checked."""
        plan = front.plan(body, self.context(front, body, caller))
        media = self.services.media
        if media is not None:
            checked = await media.check(front.media_parts(body), caller.principal.key_id)
            plan = with_gen(plan, media_intake.apply(plan.gen, checked))
        return plan

    async def start(self, front: Front[BodyT, PlanT], body: BodyT, caller: Caller) -> Run[PlanT]:
        """Steps 1-4: the request admitted. The caller releases the run when the answer ends."""
        plan = await self.plan(front, body, caller)
        engine = self.services.engines.for_model(plan.gen.model)
        plan, searches = await front.prepare(plan, self.services)
        admitted = await admit(
            caller,
            engine,
            plan.gen,
            queues=self.services.queues,
            gateway=self.services.gateway,
            endpoint=front.endpoint,
            searches=searches,
        )
        return Run(plan, admitted, self.services)

    async def count_prompt(self, front: Planner[BodyT, PlanT], body: BodyT, caller: Caller) -> int:
        """The prompt tokens the body would bring, counted as its request would be billed (the
        engine's own count where it can tell, else the admission's generous estimate). Free,
        but one request against the key's per-minute limit."""
        plan = await self.plan(front, body, caller)
        gen = plan.gen
        gateway = self.services.gateway
        if gateway is not None:
            gateway.check_model(caller.principal, gen.model)
            await gateway.count_request(caller.record, caller.principal)
        engine = self.services.engines.for_model(gen.model)
        counted = None
        if isinstance(engine, PromptCounter):
            counted = await engine.count_prompt_tokens(gen)
        elif isinstance(engine, PromptAsker):
            counted = await engine.ask_prompt_tokens(gen)
        return counted if counted is not None else estimate_prompt_tokens(gen)
