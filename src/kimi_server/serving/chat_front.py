"""The Chat Completions door's side of the pipeline: its body as a plan, its answer as a
``chat.completion`` object or a stream of engine events that ``http/sse.py`` frames as chunks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kimi_server.engines.base import AsyncStream
from kimi_server.engines.types import EngineEvent, GenerationRequest
from kimi_server.media.intake import Part, chat_parts
from kimi_server.protocol.chat import ChatCompletionRequest
from kimi_server.serving import chat
from kimi_server.serving.chat_request import build_chat_request
from kimi_server.serving.pipeline import PlanContext, Run
from kimi_server.serving.search_echo import guard_search_answer
from kimi_server.serving.services import Services
from kimi_server.serving.web_search import check_search_tools, resolve_chat_searches


@dataclass(frozen=True)
class ChatPlan:
    gen: GenerationRequest
    include_usage: bool  # stream_options.include_usage: a last chunk with the usage


class ChatFront:
    endpoint = "chat.completions"

    def model(self, body: ChatCompletionRequest, services: Services) -> str:
        return body.model

    def plan(self, body: ChatCompletionRequest, context: PlanContext) -> ChatPlan:
        services = context.services
        gen = build_chat_request(
            body,
            served=context.served,
            budgets=services.settings.budgets,
            namespace=context.key_id,
            accepts_images=context.accepts_images,
            output_defaults=context.output_defaults,
            contracts=context.contracts,
        )
        check_search_tools(body.tools, services.searcher)
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return ChatPlan(gen, include_usage)

    def media_parts(self, body: ChatCompletionRequest) -> list[Part]:
        return chat_parts(body.messages)

    async def prepare(self, plan: ChatPlan, services: Services) -> tuple[ChatPlan, int]:
        # The server runs the searches the conversation's $web_search tool messages ask for.
        gen, searches = await resolve_chat_searches(plan.gen, services.searcher)
        return ChatPlan(gen, plan.include_usage), searches

    async def complete(self, run: Run[ChatPlan]) -> dict[str, Any]:
        return await chat.complete(self._answer(run), run.plan.gen)

    def stream(self, run: Run[ChatPlan]) -> AsyncStream[EngineEvent]:
        return self._answer(run)  # framed as chunks by http/sse.py:chat_event_sse

    def _answer(self, run: Run[ChatPlan]) -> AsyncStream[EngineEvent]:
        # After a search the server's own wording around the results is never the answer.
        return guard_search_answer(run.events(), run.plan.gen)


CHAT = ChatFront()
