"""Responses with ``{"type": "web_search"}``: the server searches within the one request.

The rounds run as ``search_rounds.py`` says. A round that ends in ``$web_search`` calls becomes
``web_search_call`` output items (with the Open Responses / OpenAI events ``in_progress`` →
``searching`` → ``completed``). Output order is the contract's: web_search_call items, then
reasoning, message and tool calls.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from typing import Any

from kimi_server.engines.base import AsyncStream, Engine
from kimi_server.engines.types import EngineEvent, ToolCallRecord
from kimi_server.search.base import SearchOutcome
from kimi_server.search.searcher import Searcher, query_of
from kimi_server.serving.common import new_id
from kimi_server.serving.responses import Event, ResponseBuilder
from kimi_server.serving.responses_request import ResponsesPlan
from kimi_server.serving.sealing import Sealer
from kimi_server.serving.search_rounds import Found, Round, SearchRounds, has_web_search

__all__ = ["SearchingBuilder", "complete", "has_web_search", "stream"]
SOURCES = "web_search_call.action.sources"
RESULTS = "web_search_call.results"


class SearchingBuilder(ResponseBuilder):
    def __init__(
        self,
        plan: ResponsesPlan,
        sealer: Sealer,
        searcher: Searcher,
        *,
        include: Sequence[str],
        max_calls: int,
    ) -> None:
        super().__init__(plan, sealer)
        self.searcher = searcher
        self.include = frozenset(include)
        self.max_calls = max_calls
        self.fresh_searches = 0

    def _search_item(self, item_id: str, status: str, outcome: SearchOutcome) -> dict[str, Any]:
        action: dict[str, Any] = {"type": "search", "query": outcome.query, "queries": [outcome.query]}
        if SOURCES in self.include and status != "in_progress":
            action["sources"] = [{"type": "url", "url": h.url} for h in outcome.hits]
        item: dict[str, Any] = {"type": "web_search_call", "id": item_id, "status": status, "action": action}
        if RESULTS in self.include and status != "in_progress":
            item["results"] = [{"title": h.title, "url": h.url, "snippet": h.snippet} for h in outcome.hits]
        return item

    async def _search(self, query: str) -> AsyncGenerator[Event | SearchOutcome, None]:
        index = self._take_index()
        item_id = new_id("ws_")
        ids = {"output_index": index, "item_id": item_id}
        pending = SearchOutcome(query)
        yield self._event(
            "response.output_item.added",
            output_index=index,
            item=self._search_item(item_id, "in_progress", pending),
        )
        yield self._event("response.web_search_call.in_progress", **ids)
        yield self._event("response.web_search_call.searching", **ids)
        run = await self.searcher.run(query)
        self.fresh_searches += run.fresh
        yield self._event("response.web_search_call.completed", **ids)
        status = "failed" if run.outcome.error else "completed"
        yield self._done(index, self._search_item(item_id, status, run.outcome))
        yield run.outcome

    async def run_searching(self, engine: Engine, first: AsyncStream[EngineEvent]) -> AsyncGenerator[Event, None]:
        """``first``: the first round's events, already primed by the router (so a request the
        engine refuses is still a plain HTTP error)."""
        for out in self._start():
            yield out
        rounds = SearchRounds(engine, self.plan.gen, self.max_calls)
        try:
            async with aclosing(rounds.run(first, self._search_round)) as steps:
                async for out in steps:
                    yield out
        except Exception as exc:
            for out in self._fail(exc):
                yield out
            return
        async with aclosing(self.run_answer(rounds.answer(lambda: self.fresh_searches))) as answer:
            async for out in answer:
                yield out

    async def _search_round(self, _: Round, found: list[ToolCallRecord]) -> AsyncGenerator[Event | Found, None]:
        """Runs the round's searches in order, each with its items and events."""
        for call in found:
            async for step in self._search(query_of(call.arguments) or ""):
                yield Found(call.id, step) if isinstance(step, SearchOutcome) else step


def stream(builder: SearchingBuilder, engine: Engine, first: AsyncStream[EngineEvent]) -> AsyncGenerator[Event, None]:
    return builder.run_searching(engine, first)


async def complete(builder: SearchingBuilder, engine: Engine, first: AsyncStream[EngineEvent]) -> dict[str, Any]:
    async for _ in builder.run_searching(engine, first):
        pass
    assert builder.final is not None, "every run ends with a terminal event"
    return builder.final
