"""The Responses door's side of the pipeline: its body as a plan, its answer as the response
object or its typed event sequence; with the web-search tool, the server's search rounds."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

from kimi_server.media.intake import Part, responses_parts
from kimi_server.protocol.responses import ResponsesRequest
from kimi_server.serving import responses, responses_search
from kimi_server.serving.pipeline import PlanContext, Run
from kimi_server.serving.primed import prime
from kimi_server.serving.responses_request import ResponsesPlan, build_responses_request
from kimi_server.serving.rounds import Rounds, terminal_type
from kimi_server.serving.services import Services
from kimi_server.serving.web_search import check_search_tools

TERMINAL = terminal_type(frozenset({"response.completed", "response.incomplete", "response.failed"}))


class ResponsesFront:
    endpoint = "responses"

    def model(self, body: ResponsesRequest, services: Services) -> str:
        return body.model

    def plan(self, body: ResponsesRequest, context: PlanContext) -> ResponsesPlan:
        services = context.services
        plan = build_responses_request(
            body,
            served=context.served,
            budgets=services.settings.budgets,
            key_id=context.key_id,
            accepts_images=context.accepts_images,
            sealer=services.sealer,
            output_defaults=context.output_defaults,
            contracts=context.contracts,
        )
        check_search_tools(body.tools, services.searcher)  # the server searches within this request
        return plan

    def media_parts(self, body: ResponsesRequest) -> list[Part]:
        return responses_parts(body.input)

    async def prepare(self, plan: ResponsesPlan, services: Services) -> tuple[ResponsesPlan, int]:
        return plan, 0

    async def complete(self, run: Run[ResponsesPlan]) -> dict[str, Any]:
        builder = _searching(run)
        if builder is None:
            # Primed: a request the engine refuses is an HTTP error, not a failed response object.
            return await responses.complete(run.plan, run.services.sealer, await prime(run.events()))
        rounds = Rounds(run.engine, lambda: builder.fresh_searches)
        try:
            result = await responses_search.complete(builder, run.engine, await prime(run.events()))
            await rounds.commit()
            return result
        finally:
            rounds.abandon()

    async def stream(self, run: Run[ResponsesPlan]) -> AsyncGenerator[dict[str, Any], None]:
        builder = _searching(run)
        rounds = None if builder is None else Rounds(run.engine, lambda: builder.fresh_searches)
        try:
            first = await prime(run.events())  # nothing is yielded before the engine answers
        except BaseException:
            if rounds is not None:
                rounds.abandon()
            raise
        if builder is None or rounds is None:
            events = responses.stream(run.plan, run.services.sealer, first)
        else:
            events = rounds.events(responses_search.stream(builder, run.engine, first), TERMINAL)
        async with aclosing(events):
            async for event in events:
                yield event


def _searching(run: Run[ResponsesPlan]) -> responses_search.SearchingBuilder | None:
    searcher = run.services.searcher
    if searcher is None or not responses_search.has_web_search(run.plan.gen):
        return None
    return responses_search.SearchingBuilder(
        run.plan,
        run.services.sealer,
        searcher,
        include=run.plan.include,
        max_calls=run.services.settings.web_search_max_calls,
    )


RESPONSES = ResponsesFront()
