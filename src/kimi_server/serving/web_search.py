"""Server-side web search for Chat Completions: the ``$web_search`` builtin_function loop.

The model's ``$web_search`` call goes to the client, which sends the call's arguments back as a
``role: "tool"`` message with the same ``tool_call_id`` (the Kimi contract). Before generating,
this module runs the search each such message asks for and puts the results in its place, so
the model reads them; the client never sees them. Results of a query are cached for a while, so
a conversation sent again does not search again; only searches the provider ran are counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from kimi_server.engines.types import GenerationRequest, Message
from kimi_server.engines.web_search_tool import WEB_SEARCH_NAME
from kimi_server.errors import InvalidRequestError
from kimi_server.search.searcher import Searcher, as_tool_text, query_of


def check_search_tools(tools: Sequence[Any] | None, searcher: Searcher | None) -> None:
    """Wire tools of either endpoint: web search needs a provider, and the builtin spelling
    must name ``$web_search``."""
    for i, tool in enumerate(tools or ()):
        kind = getattr(tool, "type", None)
        if kind == "builtin_function" and tool.function.name != WEB_SEARCH_NAME:
            raise InvalidRequestError(
                f"'tools[{i}]' names the builtin function {tool.function.name!r}; the only "
                f"builtin function is {WEB_SEARCH_NAME!r}.",
                param=f"tools[{i}].function.name",
                code="unsupported_tool",
            )
        if kind in ("web_search", "builtin_function") and searcher is None:
            raise InvalidRequestError(
                f"'tools[{i}]' asks for web search, which is not enabled on this server: an "
                "operator must configure a search provider first (web_search_provider).",
                param=f"tools[{i}]",
                code="unsupported_tool",
            )


async def resolve_chat_searches(request: GenerationRequest, searcher: Searcher | None) -> tuple[GenerationRequest, int]:
    """The request with every ``$web_search`` tool result replaced by search results, and how
    many searches the provider ran for it."""
    calls = {
        c.id: c for m in request.messages if m.role == "assistant" for c in m.tool_calls if c.kind == "builtin_function"
    }
    if not calls:
        return request, 0
    messages: list[Message] = []
    fresh = 0
    for i, m in enumerate(request.messages):
        call = calls.get(m.tool_call_id or "") if m.role == "tool" else None
        if call is None:
            messages.append(m)
            continue
        where = f"messages[{i}]"
        if call.name != WEB_SEARCH_NAME:
            raise InvalidRequestError(
                f"'{where}' answers the builtin function {call.name!r}; the only builtin "
                f"function is {WEB_SEARCH_NAME!r}.",
                param=f"{where}.tool_call_id",
                code="unsupported_tool",
            )
        if searcher is None:
            raise InvalidRequestError(
                f"'{where}' answers a $web_search call, but web search is not enabled on this server.",
                param=where,
                code="unsupported_tool",
            )
        query = query_of(m.text) or query_of(call.arguments)
        if query is None:
            raise InvalidRequestError(
                f"'{where}.content' must be the $web_search call's arguments, sent back "
                'unchanged: a JSON object with "query".',
                param=f"{where}.content",
            )
        run = await searcher.run(query)
        fresh += run.fresh
        messages.append(replace(m, text=as_tool_text(run.outcome)))
    return replace(request, messages=tuple(messages)), fresh
