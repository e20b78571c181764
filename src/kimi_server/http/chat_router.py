"""``POST /v1/chat/completions``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from kimi_server.gate.auth import Principal
from kimi_server.http.admit import admit_request
from kimi_server.http.disconnect import until_disconnected
from kimi_server.http.generating import ERRORS, named_engine, sse_response
from kimi_server.http.sse import chat_event_sse, prime
from kimi_server.http.state import app_state, authenticated
from kimi_server.media import intake as media_intake
from kimi_server.policy.output_caps import output_defaults
from kimi_server.policy.profiles import contracts
from kimi_server.protocol.chat import ChatCompletionRequest
from kimi_server.serving import chat
from kimi_server.serving.chat_request import build_chat_request
from kimi_server.serving.web_search import check_search_tools, resolve_chat_searches

router = APIRouter(tags=["Chat Completions"])


@router.post("/v1/chat/completions", responses=ERRORS)
async def create_chat_completion(
    body: ChatCompletionRequest,
    request: Request,
    principal: Principal = Depends(authenticated),
) -> Any:
    """Creates a model response for the conversation; SSE when ``stream`` is true."""
    state = app_state(request)
    engine = named_engine(state, body.model)
    gen = build_chat_request(
        body,
        served=state.engines.served(),
        budgets=state.settings.budgets,
        namespace=principal.key_id,
        accepts_images=engine.accepts_images() if engine else False,
        output_defaults=output_defaults(state.settings, principal.output_cap),
        contracts=contracts(state.settings),
    )
    engine = state.engines.for_model(gen.model)
    # every image and video checked, as data URLs, before the engine.
    if state.media is not None:
        gen = media_intake.apply(gen, await state.media.check(media_intake.chat_parts(body.messages)))
    # the server runs the searches the conversation's tool messages ask for.
    check_search_tools(body.tools, state.searcher)
    gen, searches = await resolve_chat_searches(gen, state.searcher)
    engine = await admit_request(
        request, principal, engine, gen, endpoint="chat.completions", param="messages", searches=searches
    )
    if not body.stream:
        return JSONResponse(await until_disconnected(request, chat.complete(engine, gen)))
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    events = await until_disconnected(request, prime(engine.generate(gen)))
    return sse_response(chat_event_sse(events, gen.model, include_usage=include_usage))
