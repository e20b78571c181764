"""Messages ``tools`` and ``tool_choice`` -> ToolSpecs, the ToolChoice, and the settings of the
server web search tool.

Custom tools are function tools whose schema is ``input_schema`` (checked by
``serving/common.py:check_tools`` like any function's). ``web_search_20250305`` is run by the
server (``serving/messages_search.py``) on the ``$web_search`` searcher. Other Anthropic tool
types (bash, text editor, code execution, web fetch, memory, tool search...) are refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from kimi_server.engines.types import ToolChoice, ToolSpec
from kimi_server.engines.web_search_tool import WEB_SEARCH_NAME
from kimi_server.errors import InvalidRequestError
from kimi_server.protocol.messages import (
    CountTokensRequest,
    CustomTool,
    ToolChoiceAny,
    ToolChoiceNone,
    ToolChoiceTool,
    WebSearchTool,
)


@dataclass(frozen=True)
class WebSearchOptions:
    """The request's ``web_search_20250305`` tool. Domains are lowercase hosts, each with an
    optional path prefix; a host matches its subdomains too."""

    where: str  # its place, "tools[i]", for errors
    max_uses: int | None = None
    allowed_domains: tuple[str, ...] = ()
    blocked_domains: tuple[str, ...] = ()

    def admits(self, url: str) -> bool:
        """Whether a result at ``url`` may be shown under the domain filters."""
        if self.allowed_domains:
            return any(_matches(url, d) for d in self.allowed_domains)
        return not any(_matches(url, d) for d in self.blocked_domains)


def _matches(url: str, domain: str) -> bool:
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    name, _, path = domain.partition("/")
    if host != name and not host.endswith("." + name):
        return False
    return not path or parts.path.lstrip("/").startswith(path)


def _domains(values: list[str] | None, where: str) -> tuple[str, ...]:
    out: list[str] = []
    for k, value in enumerate(values or ()):
        domain = value.strip().lower().removesuffix("/")
        if not domain or "://" in domain or domain.startswith("/") or " " in domain:
            raise InvalidRequestError(
                f"Invalid '{where}[{k}]': {value[:60]!r}. Give a domain such as 'example.com' (no scheme), "
                "optionally with a path ('example.com/blog').",
                param=f"{where}[{k}]",
            )
        out.append(domain)
    return tuple(out)


def _web_search(tool: WebSearchTool, where: str) -> WebSearchOptions:
    if tool.allowed_domains and tool.blocked_domains:
        raise InvalidRequestError(
            f"'{where}' sets both 'allowed_domains' and 'blocked_domains'; use one of them.",
            param=f"{where}.blocked_domains",
        )
    return WebSearchOptions(
        where,
        tool.max_uses,
        _domains(tool.allowed_domains, f"{where}.allowed_domains"),
        _domains(tool.blocked_domains, f"{where}.blocked_domains"),
    )


@dataclass(frozen=True)
class Tools:
    specs: list[ToolSpec]
    where: list[str]
    web_search: WebSearchOptions | None


def convert_tools(body: CountTokensRequest) -> Tools:
    specs: list[ToolSpec] = []
    places: list[str] = []
    search: WebSearchOptions | None = None
    for i, tool in enumerate(body.tools or ()):
        where = f"tools[{i}]"
        if isinstance(tool, CustomTool):
            specs.append(ToolSpec(tool.name, tool.description, tool.input_schema, tool.strict is True))
        elif isinstance(tool, WebSearchTool):
            if search is not None:
                raise InvalidRequestError(
                    f"'{where}' declares web search again after '{search.where}'.", param=f"{where}.name"
                )
            search = _web_search(tool, where)
            specs.append(ToolSpec(WEB_SEARCH_NAME, kind="web_search"))
        else:
            shown = repr(tool.type)[:60] if tool.type is not None else "no type"
            raise InvalidRequestError(
                f"'{where}' is a tool of type {shown}, which this server does not run. Declare client "
                "tools with 'name', 'description' and 'input_schema'; the only server tool here is "
                "'web_search_20250305'.",
                param=f"{where}.type",
                code="unsupported_tool",
            )
        places.append(where)
    return Tools(specs, places, search)


def convert_tool_choice(body: CountTokensRequest, tools: Tools) -> tuple[ToolChoice, bool]:
    """The choice, and whether the model may make several calls at once. Naming the server's
    ``web_search`` forces a search (Claude Code's WebSearch asks so)."""
    choice = body.tool_choice
    if choice is None:
        return ToolChoice("auto"), True
    if isinstance(choice, ToolChoiceNone):
        return ToolChoice("none"), True
    parallel = choice.disable_parallel_tool_use is not True
    if isinstance(choice, ToolChoiceTool):
        named = choice.name
        if tools.web_search is not None and named == "web_search" and all(s.name != named for s in tools.specs):
            named = WEB_SEARCH_NAME
        return ToolChoice("named", named), parallel
    return ToolChoice("required" if isinstance(choice, ToolChoiceAny) else "auto"), parallel
