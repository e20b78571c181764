"""The Messages door's side of the pipeline (Anthropic's Messages API, as Kimi's platform serves
it for Claude Code and the ``anthropic`` SDKs): its body as a plan, its answer as the message
object or its event stream; with the ``web_search_20250305`` tool, the server's search rounds."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from contextlib import aclosing
from dataclasses import replace
from typing import Any

from kimi_server.engines.base import AsyncStream
from kimi_server.media.intake import Part
from kimi_server.policy.aliases import resolve_alias
from kimi_server.protocol.messages import CountTokensRequest, MessagesRequest
from kimi_server.serving import messages, messages_search
from kimi_server.serving.messages_blocks import Event
from kimi_server.serving.messages_input import media_parts
from kimi_server.serving.messages_request import MessagesPlan, build_count_tokens_plan, build_messages_plan
from kimi_server.serving.messages_search import SearchingMessageBuilder, check_searcher
from kimi_server.serving.pipeline import PlanContext, Run
from kimi_server.serving.primed import prime
from kimi_server.serving.rounds import Rounds
from kimi_server.serving.services import Services

# The ledger row is written before the usage reaches the client: message_delta carries it.
_TERMINAL = frozenset({"message_delta", "error"})


def _aliases(model: str, services: Services) -> Mapping[str, str]:
    """The one alias this body's model id needs, if any (patterns resolved here)."""
    target = resolve_alias(model, services.settings.model_aliases)
    return {model: target} if target != model else {}


def _context_args(body: CountTokensRequest, context: PlanContext) -> dict[str, Any]:
    services = context.services
    return {
        "served": context.served,
        "budgets": services.settings.budgets,
        "key_id": context.key_id,
        "accepts_images": context.accepts_images,
        "sealer": services.sealer,
        "output_defaults": context.output_defaults,
        "contracts": context.contracts,
        "aliases": _aliases(body.model, services),
    }


def _with_end_user(plan: MessagesPlan) -> MessagesPlan:
    return replace(plan, gen=replace(plan.gen, end_user=plan.user_id)) if plan.user_id else plan


class MessagesFront:
    endpoint = "messages"

    def model(self, body: MessagesRequest, services: Services) -> str:
        return resolve_alias(body.model, services.settings.model_aliases)

    def plan(self, body: MessagesRequest, context: PlanContext) -> MessagesPlan:
        plan = build_messages_plan(body, **_context_args(body, context))
        check_searcher(plan, context.services.searcher)
        return _with_end_user(plan)

    def media_parts(self, body: MessagesRequest) -> list[Part]:
        return media_parts(body)

    async def prepare(self, plan: MessagesPlan, services: Services) -> tuple[MessagesPlan, int]:
        return plan, 0

    async def complete(self, run: Run[MessagesPlan]) -> dict[str, Any]:
        sealer, counted = run.services.sealer, run.admitted.prompt_tokens
        builder = _searching(run)
        if builder is None:
            return await messages.complete(run.plan, sealer, run.events(), prompt_tokens=counted)
        rounds = Rounds(run.engine, lambda: builder.fresh_searches)
        try:
            result = await messages_search.complete(builder, run.engine, await prime(run.events()))
            await rounds.commit()
            return result
        finally:
            rounds.abandon()

    def stream(self, run: Run[MessagesPlan]) -> AsyncStream[Event]:
        builder = _searching(run)
        if builder is None:  # the builder pulls the engine's first event before its own first
            return messages.stream(
                run.plan, run.services.sealer, run.events(), prompt_tokens=run.admitted.prompt_tokens
            )
        return _searched(run, builder)


async def _searched(run: Run[MessagesPlan], builder: SearchingMessageBuilder) -> AsyncGenerator[Event, None]:
    rounds = Rounds(run.engine, lambda: builder.fresh_searches)
    try:
        first = await prime(run.events())  # nothing is yielded before the engine answers
    except BaseException:
        rounds.abandon()
        raise
    events = rounds.events(messages_search.stream(builder, run.engine, first), _is_terminal)
    async with aclosing(events):
        async for event in events:
            yield event


def _is_terminal(event: Event) -> bool:
    return event[0] in _TERMINAL


def _searching(run: Run[MessagesPlan]) -> SearchingMessageBuilder | None:
    searcher = run.services.searcher
    if searcher is None or run.plan.web_search is None:
        return None
    return SearchingMessageBuilder(
        run.plan,
        run.services.sealer,
        searcher,
        max_calls=run.services.settings.web_search_max_calls,
        prompt_tokens=run.admitted.prompt_tokens,
    )


class CountTokensPlanner:
    """``POST /v1/messages/count_tokens``: the same request create would build, counted."""

    def model(self, body: CountTokensRequest, services: Services) -> str:
        return resolve_alias(body.model, services.settings.model_aliases)

    def plan(self, body: CountTokensRequest, context: PlanContext) -> MessagesPlan:
        return build_count_tokens_plan(body, **_context_args(body, context))

    def media_parts(self, body: CountTokensRequest) -> list[Part]:
        return media_parts(body)


MESSAGES = MessagesFront()
COUNT_TOKENS = CountTokensPlanner()
