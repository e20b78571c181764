"""``POST /v1/responses``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from kimi_server.gate.auth import Principal
from kimi_server.http.admit import Rounds, admit_request
from kimi_server.http.disconnect import until_disconnected
from kimi_server.http.generating import ERRORS, named_engine, sse_response
from kimi_server.http.sse import event_frame, prime
from kimi_server.http.state import app_state, authenticated
from kimi_server.media import intake as media_intake
from kimi_server.policy.output_caps import output_defaults
from kimi_server.policy.profiles import contracts
from kimi_server.protocol.responses import ResponsesRequest
from kimi_server.serving import (
    responses,
    responses_search,
)
from kimi_server.serving.responses_request import build_responses_request
from kimi_server.serving.web_search import check_search_tools

router = APIRouter(tags=["Responses"])


async def responses_sse(events: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    """``event: <type>`` plus one ``data:`` line per event; failures arrive as response.failed."""
    async for event in events:
        yield event_frame(event["type"], event)


@router.post("/v1/responses", responses=ERRORS)
async def create_response(
    body: ResponsesRequest,
    request: Request,
    principal: Principal = Depends(authenticated),
) -> Any:
    """Creates a model response; SSE when ``stream`` is true. Stateless: nothing is stored."""
    state = app_state(request)
    engine = named_engine(state, body.model)
    plan = build_responses_request(
        body,
        served=state.engines.served(),
        budgets=state.settings.budgets,
        key_id=principal.key_id,
        accepts_images=engine.accepts_images() if engine else False,
        sealer=state.sealer,
        output_defaults=output_defaults(state.settings, principal.output_cap),
        contracts=contracts(state.settings),
    )
    engine = state.engines.for_model(plan.gen.model)
    # the server searches within this one request.
    check_search_tools(body.tools, state.searcher)
    # every image checked, as data URLs, before the engine.
    if state.media is not None:
        checked = await state.media.check(media_intake.responses_parts(body.input))
        plan = replace(plan, gen=media_intake.apply(plan.gen, checked))
    engine = await admit_request(request, principal, engine, plan.gen, endpoint="responses", param="input")
    if state.searcher is not None and responses_search.has_web_search(plan.gen):
        builder = responses_search.SearchingBuilder(
            plan,
            state.sealer,
            state.searcher,
            include=body.include or (),
            max_calls=state.settings.web_search_max_calls,
        )
        rounds = Rounds(engine, lambda: builder.fresh_searches)
        if not body.stream:

            async def searched() -> dict[str, Any]:
                try:
                    first = await prime(engine.generate(plan.gen))
                    result = await responses_search.complete(builder, engine, first)
                    await rounds.commit()
                    return result
                finally:
                    rounds.abandon()

            return JSONResponse(await until_disconnected(request, searched()))
        try:
            first = await prime(engine.generate(plan.gen))
        except BaseException:
            rounds.abandon()
            raise
        return sse_response(responses_sse(rounds.events(responses_search.stream(builder, engine, first))))
    if not body.stream:

        async def answer() -> dict[str, Any]:
            events = await prime(engine.generate(plan.gen))
            return await responses.complete(plan, state.sealer, events)

        return JSONResponse(await until_disconnected(request, answer()))
    # The first engine event is pulled before anything is sent, so early failures are HTTP errors.
    events = await until_disconnected(request, prime(engine.generate(plan.gen)))
    return sse_response(responses_sse(responses.stream(plan, state.sealer, events)))
