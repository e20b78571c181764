"""Responses with ``{"type": "web_search"}``: the server searches within the one request.

Each round asks the engine for an answer with the search tool available. A round that ends in
``$web_search`` calls becomes ``web_search_call`` output items (with the Open Responses /
OpenAI events ``in_progress`` → ``searching`` → ``completed``); its results join the
conversation and the next round answers. After ``max_calls`` searches the tool is withdrawn so
the model must answer. Output order is the contract's: web_search_call items, then reasoning,
message and tool calls. A round that may still search is held back until it ends (whether it
searches is only known then); the last round streams live.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from dataclasses import dataclass, replace
from typing import Any

from kimi_server.engines.base import AsyncStream, Engine
from kimi_server.engines.types import (
    ContentDelta,
    EngineEvent,
    Finish,
    GenerationRequest,
    Message,
    ReasoningDelta,
    ToolCallDelta,
    ToolCallRecord,
    Usage,
)
from kimi_server.search.base import SearchOutcome
from kimi_server.search.searcher import Searcher, as_tool_text, query_of
from kimi_server.serving.common import new_id
from kimi_server.serving.responses import Event, ResponseBuilder
from kimi_server.serving.responses_request import ResponsesPlan
from kimi_server.serving.sealing import Sealer

SOURCES = "web_search_call.action.sources"
RESULTS = "web_search_call.results"


@dataclass
class _Round:
    events: list[EngineEvent]

    def calls(self) -> list[ToolCallRecord]:
        parts: dict[int, dict[str, Any]] = {}
        for e in self.events:
            if isinstance(e, ToolCallDelta):
                p = parts.setdefault(e.index, {"id": e.id, "name": e.name, "args": "", "kind": e.kind})
                p["args"] += e.arguments
        return [
            ToolCallRecord(p["id"] or new_id("call_"), p["name"] or "", p["args"], p["kind"])
            for _, p in sorted(parts.items())
        ]

    def finish(self) -> Finish:
        last = self.events[-1] if self.events else None
        if not isinstance(last, Finish):
            raise RuntimeError("the engine stopped without a Finish event")
        return last

    def as_message(self, searches: list[ToolCallRecord]) -> Message:
        """The round as the assistant turn that made ``searches``."""
        return Message(
            "assistant",
            text="".join(e.text for e in self.events if isinstance(e, ContentDelta)),
            reasoning="".join(e.text for e in self.events if isinstance(e, ReasoningDelta)),
            tool_calls=tuple(searches),
        )

    def without_searches(self, searches: set[str]) -> list[EngineEvent]:
        """The round's events minus its search calls (argument deltas carry no id: by index)."""
        dropped = {e.index for e in self.events if isinstance(e, ToolCallDelta) and e.id in searches}
        return [e for e in self.events if not (isinstance(e, ToolCallDelta) and e.index in dropped)]


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
        gen = self.plan.gen
        messages = list(gen.messages)
        spent = Usage()
        searches = 0
        final: list[EngineEvent] | None = None
        try:
            while searches < self.max_calls:
                source = first if not searches else engine.generate(_rest(gen, messages, spent))
                round_ = await _collect(source)
                finish = round_.finish()
                calls = round_.calls()
                found = [c for c in calls if c.kind == "builtin_function"]
                if not found:
                    final = round_.events
                    break
                spent += finish.usage
                messages.append(round_.as_message(found))
                async for step in self._search_all(found, messages):
                    yield step
                searches += len(found)
                if len(found) < len(calls):  # function calls beside the search: the client's turn
                    final = round_.without_searches({c.id for c in found})
                    break
        except Exception as exc:
            for out in self._fail(exc):
                yield out
            return
        events = _answer_events(engine, gen, messages, spent, final)
        async with aclosing(self.run_answer(_with_usage(events, spent, self))) as answer:
            async for out in answer:
                yield out

    async def _search_all(self, found: list[ToolCallRecord], messages: list[Message]) -> AsyncGenerator[Event, None]:
        """Runs the round's searches in order, each result joining ``messages`` as its tool message."""
        for call in found:
            async for step in self._search(query_of(call.arguments) or ""):
                if isinstance(step, SearchOutcome):
                    messages.append(Message("tool", as_tool_text(step), tool_call_id=call.id))
                else:
                    yield step


async def _collect(source: AsyncStream[EngineEvent]) -> _Round:
    round_ = _Round([])
    async with aclosing(source) as it:
        async for event in it:
            round_.events.append(event)
    return round_


def _answer_events(
    engine: Engine,
    gen: GenerationRequest,
    messages: list[Message],
    spent: Usage,
    final: list[EngineEvent] | None,
) -> AsyncStream[EngineEvent]:
    """The answering round: the one that ended the searching, replayed, or a fresh one."""
    if final is not None:
        return _replay(final)
    # the search budget is spent: the model answers with what it found
    tools = tuple(t for t in gen.tools if t.kind != "web_search")
    return engine.generate(replace(_rest(gen, messages, spent), tools=tools))


def _rest(gen: GenerationRequest, messages: list[Message], spent: Usage) -> GenerationRequest:
    """The next round: the longer conversation, and what is left of ``max_output_tokens`` (it
    bounds the whole response, every round's reasoning and calls included)."""
    left = max(1, gen.max_output_tokens - spent.completion_tokens)
    return replace(gen, messages=tuple(messages), max_output_tokens=left)


async def _replay(events: list[EngineEvent]) -> AsyncGenerator[EngineEvent, None]:
    for e in events:
        yield e


async def _with_usage(
    events: AsyncStream[EngineEvent], spent: Usage, builder: SearchingBuilder
) -> AsyncGenerator[EngineEvent, None]:
    async with aclosing(events):
        async for e in events:
            if isinstance(e, Finish):
                total = spent + e.usage
                e = Finish(e.reason, replace(total, web_search_calls=builder.fresh_searches))
            yield e


def has_web_search(gen: GenerationRequest) -> bool:
    return any(t.kind == "web_search" for t in gen.tools)


def stream(builder: SearchingBuilder, engine: Engine, first: AsyncStream[EngineEvent]) -> AsyncGenerator[Event, None]:
    return builder.run_searching(engine, first)


async def complete(builder: SearchingBuilder, engine: Engine, first: AsyncStream[EngineEvent]) -> dict[str, Any]:
    async for _ in builder.run_searching(engine, first):
        pass
    assert builder.final is not None, "every run ends with a terminal event"
    return builder.final
