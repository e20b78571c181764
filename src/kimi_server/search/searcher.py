"""Runs searches for the endpoints: provider, result cap, token budget, a short cache, counts.

The model reads results as plain text (``as_tool_text``); ``sources`` keep title, URL and
snippet for the Responses ``web_search_call`` item. Tokens are estimated at four characters each:
the serving layer has no tokenizer, and the budget is a bound, not an exact count.
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from dataclasses import dataclass, replace

from kimi_server.search.base import SearchFailed, SearchHit, SearchOutcome, SearchProvider

CHARS_PER_TOKEN = 4
MAX_QUERY_CHARS = 500
_CACHE_ENTRIES = 256


@dataclass(frozen=True)
class SearchRun:
    outcome: SearchOutcome
    fresh: bool  # the provider was asked (False: served from the cache); fresh runs are counted


class Searcher:
    def __init__(
        self,
        provider: SearchProvider,
        *,
        max_results: int,
        token_budget: int,
        cache_ttl_s: float = 600.0,
    ) -> None:
        self.provider = provider
        self.max_results = max_results
        self.token_budget = token_budget
        self.cache_ttl_s = cache_ttl_s
        self._cache: OrderedDict[str, tuple[float, SearchOutcome]] = OrderedDict()
        self.calls = 0  # searches sent to the provider since start (operator counter)

    async def run(self, query: str) -> SearchRun:
        query = " ".join(query.split())[:MAX_QUERY_CHARS]
        hit = self._cache.get(query)
        if hit is not None and time.monotonic() - hit[0] < self.cache_ttl_s:
            self._cache.move_to_end(query)
            return SearchRun(hit[1], fresh=False)
        self.calls += 1
        if not query:
            return SearchRun(SearchOutcome(query, error="the search query was empty"), fresh=True)
        try:
            outcome = await self.provider.search(query, self.max_results)
        except SearchFailed as exc:
            return SearchRun(SearchOutcome(query, error=str(exc)), fresh=True)
        outcome = replace(outcome, hits=fit_budget(outcome.hits, self.token_budget))
        self._cache[query] = (time.monotonic(), outcome)
        if len(self._cache) > _CACHE_ENTRIES:
            self._cache.popitem(last=False)
        return SearchRun(outcome, fresh=True)


def fit_budget(hits: tuple[SearchHit, ...], token_budget: int) -> tuple[SearchHit, ...]:
    """Keeps whole title + URL for each hit it keeps; snippets are shortened, later hits dropped."""
    left = token_budget * CHARS_PER_TOKEN
    out: list[SearchHit] = []
    for h in hits:
        fixed = len(h.title) + len(h.url) + 16
        if fixed > left:
            break
        snippet = h.snippet[: max(0, left - fixed)]
        if len(snippet) < len(h.snippet):
            snippet = snippet.rsplit(" ", 1)[0] + " …" if " " in snippet else snippet
        out.append(SearchHit(h.title, h.url, snippet))
        left -= fixed + len(snippet)
    return tuple(out)


# Everything the server itself writes around search results, for the model to read. Kept
# here as templates so that an answer repeating them can be recognised (serving/search_echo.py).
FAILED = "Web search for {query} failed: {error}. Answer without it."
FOUND_NOTHING = "Web search for {query} found nothing."
RESULTS_HEADER = "Web search results for {query}:"
RESULT = "[{n}] {title}\nURL: {url}\n{snippet}"
RESULTS_FOOTER = "Answer the user's question in your own words from these results."
SERVER_WORDING = (FAILED, FOUND_NOTHING, RESULTS_HEADER, RESULT, RESULTS_FOOTER)


def as_tool_text(outcome: SearchOutcome) -> str:
    """What the model reads as the search's tool result."""
    query = repr(outcome.query)
    if outcome.error:
        return FAILED.format(query=query, error=outcome.error)
    if not outcome.hits:
        return FOUND_NOTHING.format(query=query)
    lines = [RESULTS_HEADER.format(query=query)]
    for n, h in enumerate(outcome.hits, 1):
        lines.append(RESULT.format(n=n, title=h.title, url=h.url, snippet=h.snippet))
    lines.append(RESULTS_FOOTER)
    return "\n\n".join(lines)


def query_of(arguments: str) -> str | None:
    """The query in a ``$web_search`` call's arguments (a JSON object with ``query``)."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return None
    if isinstance(value, dict) and isinstance(value.get("query"), str):
        return str(value["query"])
    return None
