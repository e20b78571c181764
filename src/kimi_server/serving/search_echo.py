"""The server's own search wording is never returned as an answer.

After a search the model reads a tool message the server wrote: its framing (``Web search
results for …``, ``Answer the user's question in your own words …``: the templates in
``search/searcher.py``) around the results. A small model sometimes answers by repeating that
framing. Whether it did is judged on what the answer says, not on a list of phrases: each word
is the server's wording (part of a word pair the templates hold), the query searched for
(neither here nor there), or something else (the results, the model's own words). An answer
whose words are next to all the server's is an echo.

The answer's text is held back until it has a few words beyond the server's (about a short
sentence); from then on it streams as it comes. One that ends while held is judged whole: an
echo is not returned (an error takes its place; tool calls it made still stand), and a run of
the server's wording inside an answer (``… teal. Answer the user's question …``) is cut out.
"""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator, Iterable, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from enum import Enum
from itertools import pairwise

from kimi_server.engines.base import AsyncStream
from kimi_server.engines.types import ContentDelta, EngineEvent, Finish, GenerationRequest, Message, ToolCallDelta
from kimi_server.errors import APIError
from kimi_server.search.searcher import SERVER_WORDING, query_of

Pair = tuple[str, str]
_WORD = re.compile(r"\w+")
_PLACEHOLDER = re.compile(r"\\\{(\w+)\\\}")  # a placeholder, once re.escape'd
MIN_ECHOED_WORDS = 3  # fewer of the server's words are no echo ("From these results: teal.")
ECHO_RATIO = 5  # the server's words at least this many times the rest: an echo
MIN_CUT_RUN = 5  # consecutive words of the server's wording cut out of an answer
WORDS_TO_RELEASE = 5  # words beyond the server's after which the answer streams on


class EchoedInstructionsError(APIError):
    status_code = 500
    error_type = "server_error"
    default_code = "answer_failed"

    def __init__(self) -> None:
        super().__init__(
            "The model answered with the server's own search instructions instead of an answer, so no "
            "answer is returned. Send the request again."
        )


class Kind(Enum):
    SERVER = "server"
    QUERY = "query"
    OTHER = "other"


@dataclass(frozen=True)
class Word:
    text: str
    start: int
    end: int


def _words(text: str) -> list[Word]:
    return [Word(m.group().lower(), m.start(), m.end()) for m in _WORD.finditer(text)]


def _template_pairs(templates: Iterable[str]) -> frozenset[Pair]:
    """Word pairs of the fixed parts of each template (a pair never spans a placeholder)."""
    pairs: set[Pair] = set()
    for template in templates:
        for fixed in re.split(r"\{\w+\}", template):
            pairs.update(pairwise(w.text for w in _words(fixed)))
    return frozenset(pairs)


def _query_patterns(templates: Iterable[str]) -> list[re.Pattern[str]]:
    """Each one-line template as a pattern that finds the query it was written with."""
    patterns = []
    for template in templates:
        if "{query}" in template and "\n" not in template:
            body = _PLACEHOLDER.sub(lambda m: "(?P<query>.+?)" if m[1] == "query" else ".*?", re.escape(template))
            patterns.append(re.compile(body, re.MULTILINE))
    return patterns


SERVER_PAIRS = _template_pairs(SERVER_WORDING)
QUERY_PATTERNS = _query_patterns(SERVER_WORDING)


class EchoJudge:
    """Judges answers against the tool messages the server wrote for one request."""

    def __init__(self, written: Sequence[str], queries: Iterable[str] = ()) -> None:
        found = [m["query"] for text in written for p in QUERY_PATTERNS for m in p.finditer(text)]
        self.query_words = frozenset(w.text for q in [*queries, *found] for w in _words(q))

    def kinds(self, words: Sequence[Word]) -> list[Kind]:
        out = []
        for i, word in enumerate(words):
            around = [(words[i - 1].text, word.text)] if i else []
            if i + 1 < len(words):
                around.append((word.text, words[i + 1].text))
            if any(p in SERVER_PAIRS for p in around):
                out.append(Kind.SERVER)
            else:
                out.append(Kind.QUERY if word.text in self.query_words else Kind.OTHER)
        return out

    def echoes(self, text: str) -> bool:
        kinds = self.kinds(_words(text))
        server, other = kinds.count(Kind.SERVER), kinds.count(Kind.OTHER)
        return server >= MIN_ECHOED_WORDS and server >= ECHO_RATIO * other

    def released(self, text: str) -> bool:
        """Enough words beyond the server's (the last, maybe unfinished, word aside) to stream on."""
        kinds = self.kinds(_words(text)[:-1])
        server, other = kinds.count(Kind.SERVER), kinds.count(Kind.OTHER)
        return other >= WORDS_TO_RELEASE and server < ECHO_RATIO * other

    def cut(self, text: str) -> str:
        """``text`` without its runs of the server's wording."""
        words = _words(text)
        kinds = self.kinds(words)
        out, kept_from, i = [], 0, 0
        while i < len(words):
            j = i
            while j < len(words) and kinds[j] is Kind.SERVER:
                j += 1
            if j - i >= MIN_CUT_RUN:
                out.append(text[kept_from : words[i].start])
                kept_from = words[j].start if j < len(words) else len(text)
            i = max(j, i + 1)
        out.append(text[kept_from:])
        return "".join(out).rstrip() if kept_from == len(text) else "".join(out)


def server_written(messages: Iterable[Message]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The tool messages the server wrote (results of the ``$web_search`` calls they answer)
    and the queries of those calls."""
    searches: set[str] = set()
    written: list[str] = []
    queries: list[str] = []
    for m in messages:
        if m.role == "assistant":
            for call in m.tool_calls:
                if call.kind == "builtin_function":
                    searches.add(call.id)
                    queries.append(query_of(call.arguments) or "")
        elif m.role == "tool" and m.tool_call_id in searches:
            written.append(m.text)
    return tuple(written), tuple(queries)


def guard_search_answer(events: AsyncStream[EngineEvent], request: GenerationRequest) -> AsyncStream[EngineEvent]:
    """The engine's events for ``request``, guarded when it answers after a search."""
    written, queries = server_written(request.messages)
    return guard_answer(events, EchoJudge(written, queries)) if written else events


async def guard_answer(events: AsyncStream[EngineEvent], judge: EchoJudge) -> AsyncGenerator[EngineEvent, None]:
    """``events`` with an answer that repeats the server's wording taken out (see the module)."""
    held: list[EngineEvent] | None = None  # from the answer's first text until it is released
    text = ""
    async with aclosing(events):
        async for event in events:
            if held is None and isinstance(event, ContentDelta) and not text:
                held = []
            if held is None:
                yield event
            elif isinstance(event, Finish):
                for kept in _settle(held, text, judge):
                    yield kept
                held = None
                yield event
            else:
                held.append(event)
                text += event.text if isinstance(event, ContentDelta) else ""
                if isinstance(event, ContentDelta) and judge.released(text):
                    for kept in held:
                        yield kept
                    held = None


def _settle(held: list[EngineEvent], text: str, judge: EchoJudge) -> list[EngineEvent]:
    """What an answer held to its end becomes: itself; without the server's wording it quotes;
    or, when it is an echo, without its text (an error when nothing else is left)."""
    rest: list[EngineEvent] = [e for e in held if not isinstance(e, ContentDelta)]
    if judge.echoes(text):
        if not any(isinstance(e, ToolCallDelta) for e in rest):
            raise EchoedInstructionsError()
        return rest
    cleaned = judge.cut(text)
    if cleaned == text:
        return held
    return [ContentDelta(cleaned), *rest]
