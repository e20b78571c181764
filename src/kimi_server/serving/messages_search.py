"""Messages with the ``web_search_20250305`` server tool: the server searches within the request.

The rounds run as ``search_rounds.py`` says, on the searcher ``$web_search`` uses. Each round
that searched shows as its blocks in Anthropic's order: its thinking and text, then for each
search a ``server_tool_use`` block (``srvtoolu_…``, input ``{"query"}``) and its
``web_search_tool_result`` block (results with url, title and the text the model read, sealed
as ``encrypted_content``; or a ``web_search_tool_result_error``). The answering round follows.

``max_uses`` counts the searches run; a call past it is answered with the error
``max_uses_exceeded`` (the model reads that it must answer without). ``allowed_domains`` /
``blocked_domains`` filter the hits by host before the model sees them.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import replace
from typing import Any

from kimi_server.engines.base import AsyncStream, Engine
from kimi_server.engines.types import ContentDelta, EngineEvent, ReasoningDelta, ToolCallRecord
from kimi_server.errors import InvalidRequestError
from kimi_server.search.base import SearchOutcome
from kimi_server.search.searcher import Searcher, query_of
from kimi_server.serving.common import new_id
from kimi_server.serving.messages import Event, MessageBuilder
from kimi_server.serving.messages_input import RESULT_SEAL
from kimi_server.serving.messages_request import MessagesPlan
from kimi_server.serving.sealing import Sealer
from kimi_server.serving.search_rounds import Found, Round, SearchRounds

__all__ = ["SearchingMessageBuilder", "check_searcher", "complete", "stream"]
# What the model reads for a refused call, and the error code the client sees.
_REFUSED = {
    "max_uses_exceeded": "the request's max_uses for web search is spent",
    "invalid_tool_input": "the search call had no query",
}


def check_searcher(plan: MessagesPlan, searcher: Searcher | None) -> None:
    """A request with the web search tool needs a search provider on this server."""
    if plan.web_search is not None and searcher is None:
        where = plan.web_search.where
        raise InvalidRequestError(
            f"'{where}' asks for web search, which is not enabled on this server: an operator must "
            "configure a search provider first (web_search_provider).",
            param=where,
            code="unsupported_tool",
        )


class SearchingMessageBuilder(MessageBuilder):
    def __init__(
        self,
        plan: MessagesPlan,
        sealer: Sealer,
        searcher: Searcher,
        *,
        max_calls: int,
        prompt_tokens: int | None = None,
    ) -> None:
        super().__init__(plan, sealer, prompt_tokens=prompt_tokens)
        assert plan.web_search is not None, "a plan with the web search tool"
        self.options = plan.web_search
        self.searcher = searcher
        self.max_calls = max_calls  # the server's own bound on searches per request
        self.used = 0  # searches run, against max_uses
        self.fresh_searches = 0  # searches the provider ran (not served from its cache): billed

    async def run_searching(self, engine: Engine, first: AsyncStream[EngineEvent]) -> AsyncGenerator[Event, None]:
        """``first``: the first round's events, already primed by the caller (so a request the
        engine refuses is still a plain HTTP error)."""
        yield self.start()
        rounds = SearchRounds(engine, self.plan.gen, self.max_calls)
        try:
            async with aclosing(rounds.run(first, self._search_round)) as steps:
                async for out in steps:
                    yield out
        except Exception as exc:
            yield self.fail(exc)
            return
        events = rounds.answer(lambda: self.fresh_searches)
        if rounds.final_searched:
            events = _calls_only(events)  # its thinking and text are shown with its searches
        async with aclosing(self.run_answer(events)) as answer:
            async for out in answer:
                yield out

    async def _search_round(self, round_: Round, found: list[ToolCallRecord]) -> AsyncGenerator[Event | Found, None]:
        for out in self.reasoning_delta(round_.reasoning) + self.content_delta(round_.text) + self._close():
            yield out
        for call in found:
            query = query_of(call.arguments)
            block_id = new_id("srvtoolu_")
            use = {"type": "server_tool_use", "id": block_id, "name": "web_search", "input": {}}
            arguments = json.dumps({"query": query or ""}, ensure_ascii=False)
            delta = {"type": "input_json_delta", "partial_json": arguments}
            for out in self._whole_block(use, delta, {"query": query or ""}):
                yield out
            outcome, content = await self._search(query)
            result = {"type": "web_search_tool_result", "tool_use_id": block_id, "content": content}
            for out in self._whole_block(result, None, None):
                yield out
            yield Found(call.id, outcome)
        self.answered = False  # the next round reasons afresh: a thinking block of its own

    def _whole_block(self, block: dict[str, Any], delta: dict[str, Any] | None, input_: Any) -> list[Event]:
        out = self._close()
        index = len(self.blocks)
        self.blocks.append(block if input_ is None else {**block, "input": input_})
        out.append(("content_block_start", {"type": "content_block_start", "index": index, "content_block": block}))
        if delta is not None:
            out.append(self._delta(index, delta))
        out.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
        return out

    async def _search(self, query: str | None) -> tuple[SearchOutcome, Any]:
        """What the model reads, and the result block's ``content``."""
        limit = self.options.max_uses
        refused = "invalid_tool_input" if not query else None
        if limit is not None and self.used >= limit:
            refused = "max_uses_exceeded"
        if refused is not None:
            outcome = SearchOutcome(query or "", error=_REFUSED[refused])
            return outcome, {"type": "web_search_tool_result_error", "error_code": refused}
        assert query is not None
        self.used += 1
        run = await self.searcher.run(query)
        self.fresh_searches += run.fresh
        if run.outcome.error:
            return run.outcome, {"type": "web_search_tool_result_error", "error_code": "unavailable"}
        outcome = replace(run.outcome, hits=tuple(h for h in run.outcome.hits if self.options.admits(h.url)))
        results = [
            {
                "type": "web_search_result",
                "url": h.url,
                "title": h.title,
                "encrypted_content": self.sealer.seal(h.snippet, key_id=self.plan.key_id, purpose=RESULT_SEAL),
                "page_age": None,
            }
            for h in outcome.hits
        ]
        return outcome, results


async def _calls_only(events: AsyncStream[EngineEvent]) -> AsyncGenerator[EngineEvent, None]:
    async with aclosing(events):
        async for e in events:
            if not isinstance(e, ReasoningDelta | ContentDelta):
                yield e


def stream(
    builder: SearchingMessageBuilder, engine: Engine, first: AsyncStream[EngineEvent]
) -> AsyncGenerator[Event, None]:
    return builder.run_searching(engine, first)


async def complete(builder: SearchingMessageBuilder, engine: Engine, first: AsyncStream[EngineEvent]) -> dict[str, Any]:
    return await builder.result(builder.run_searching(engine, first))
