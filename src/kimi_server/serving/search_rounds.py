"""Server-side web search in rounds within one request, for every endpoint that runs it.

Each round asks the engine for an answer with the search tool available. A round that ends in
``$web_search`` calls is held back until it ends (whether it searches is only known then); its
searches run, their results join the conversation as tool messages, and the next round answers.
After ``max_calls`` searches the tool is withdrawn so the model must answer. The answering round
(the one that ended the searching, replayed, or a fresh one) streams live, with the usage of
every round. How the searches are shown is the endpoint's own: ``responses_search.py``,
``messages_search.py``.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from dataclasses import dataclass, replace
from typing import Any, TypeVar

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
    ToolChoice,
    Usage,
)
from kimi_server.search.base import SearchOutcome
from kimi_server.search.searcher import as_tool_text
from kimi_server.serving.common import new_id
from kimi_server.serving.search_echo import EchoJudge, guard_answer, server_written

T = TypeVar("T")


@dataclass
class Round:
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

    @property
    def reasoning(self) -> str:
        return "".join(e.text for e in self.events if isinstance(e, ReasoningDelta))

    @property
    def text(self) -> str:
        return "".join(e.text for e in self.events if isinstance(e, ContentDelta))

    def as_message(self, searches: list[ToolCallRecord]) -> Message:
        """The round as the assistant turn that made ``searches``."""
        return Message("assistant", text=self.text, reasoning=self.reasoning, tool_calls=tuple(searches))

    def without_searches(self, searches: set[str]) -> list[EngineEvent]:
        """The round's events minus its search calls (argument deltas carry no id: by index)."""
        dropped = {e.index for e in self.events if isinstance(e, ToolCallDelta) and e.id in searches}
        return [e for e in self.events if not (isinstance(e, ToolCallDelta) and e.index in dropped)]


@dataclass(frozen=True)
class Found:
    """What an endpoint's search step hands back for one call: the outcome the model reads."""

    call_id: str
    outcome: SearchOutcome


# An endpoint's step for one searching round: its own output for the round and each search,
# with a ``Found`` for every call.
SearchStep = Callable[[Round, list[ToolCallRecord]], AsyncGenerator[T | Found, None]]


class SearchRounds:
    def __init__(self, engine: Engine, gen: GenerationRequest, max_calls: int) -> None:
        self.engine = engine
        self.gen = gen
        self.max_calls = max_calls
        self.messages = list(gen.messages)
        self.spent = Usage()  # the usage of the rounds that searched
        self.searches = 0
        self.final: list[EngineEvent] | None = None  # the answering round, when it already ran
        # The answering round also searched (a function call beside): its reasoning and text
        # belong to a round the endpoint has already shown.
        self.final_searched = False

    async def run(self, first: AsyncStream[EngineEvent], step: SearchStep[T]) -> AsyncGenerator[T, None]:
        """Searching rounds until one answers. ``first``: the first round's events, already
        primed by the caller (so a request the engine refuses is still a plain HTTP error)."""
        while self.searches < self.max_calls:
            source = first if not self.searches else self.engine.generate(self._next())
            round_ = await _collect(source)
            finish = round_.finish()
            calls = round_.calls()
            found = [c for c in calls if c.kind == "builtin_function"]
            if not found:
                self.final = round_.events
                return
            self.spent += finish.usage
            self.messages.append(round_.as_message(found))
            async with aclosing(step(round_, found)) as steps:
                async for item in steps:
                    if isinstance(item, Found):
                        text = as_tool_text(item.outcome)
                        self.messages.append(Message("tool", text, tool_call_id=item.call_id))
                    else:
                        yield item
            self.searches += len(found)
            if len(found) < len(calls):  # function calls beside the search: the client's turn
                self.final = round_.without_searches({c.id for c in found})
                self.final_searched = True
                return

    def answer(self, fresh_searches: Callable[[], int]) -> AsyncStream[EngineEvent]:
        """The answering round's events, its Finish carrying every round's usage and the
        searches the provider ran (``fresh_searches``: counted by the endpoint's step)."""
        if self.final is not None:
            events = _replay(self.final)
        else:  # the search budget is spent: the model answers with what it found
            tools = tuple(t for t in self.gen.tools if t.kind != "web_search")
            events = self.engine.generate(replace(self._next(), tools=tools))
        written, queries = server_written(self.messages)
        if written:  # never the server's own search wording as the answer (serving/search_echo.py)
            events = guard_answer(events, EchoJudge(written, queries))
        return _with_usage(events, self.spent, fresh_searches)

    def _next(self) -> GenerationRequest:
        """The next round: the longer conversation, and what is left of the output cap (it
        bounds the whole answer, every round's reasoning and calls included). A choice that
        forced a call was met by the search: later rounds choose freely (forced again, the model
        could only search until the bound, and a named search tool is withdrawn at the end)."""
        left = max(1, self.gen.max_output_tokens - self.spent.completion_tokens)
        choice = self.gen.tool_choice
        if choice.mode in ("required", "named"):
            choice = ToolChoice("auto")
        return replace(self.gen, messages=tuple(self.messages), max_output_tokens=left, tool_choice=choice)


async def _collect(source: AsyncStream[EngineEvent]) -> Round:
    round_ = Round([])
    async with aclosing(source) as it:
        async for event in it:
            round_.events.append(event)
    return round_


async def _replay(events: list[EngineEvent]) -> AsyncGenerator[EngineEvent, None]:
    for e in events:
        yield e


async def _with_usage(
    events: AsyncStream[EngineEvent], spent: Usage, fresh_searches: Callable[[], int]
) -> AsyncGenerator[EngineEvent, None]:
    async with aclosing(events):
        async for e in events:
            if isinstance(e, Finish):
                total = spent + e.usage
                e = replace(e, usage=replace(total, web_search_calls=fresh_searches()))
            yield e


def has_web_search(gen: GenerationRequest) -> bool:
    return any(t.kind == "web_search" for t in gen.tools)
