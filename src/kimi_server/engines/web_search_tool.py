"""How an engine shows the built-in ``$web_search`` tool to a model: as a function with a
``query`` argument. The model calls it like any function; the call comes back as a
``builtin_function`` and the server (``serving/web_search.py``) runs the search itself.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kimi_server.engines.types import GenerationRequest, ToolSpec

WEB_SEARCH_NAME = "$web_search"
WEB_SEARCH_DESCRIPTION = "Searches the web for pages about a topic and returns their text"
WEB_SEARCH_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"query": {"type": "string", "minLength": 1, "maxLength": 200}},
    "required": ["query"],
    "additionalProperties": False,
}


def search_function() -> ToolSpec:
    return ToolSpec(
        WEB_SEARCH_NAME,
        WEB_SEARCH_DESCRIPTION,
        WEB_SEARCH_PARAMETERS,
        strict=True,
        kind="web_search",
    )


def expose_web_search(request: GenerationRequest) -> GenerationRequest:
    """The request with each web-search tool spelled out as the function the model sees."""
    if not any(t.kind == "web_search" for t in request.tools):
        return request
    tools: list[ToolSpec] = []
    for t in request.tools:
        if t.kind != "web_search":
            tools.append(t)
        elif all(x.name != WEB_SEARCH_NAME for x in tools):
            tools.append(search_function())
    return replace(request, tools=tuple(tools))
