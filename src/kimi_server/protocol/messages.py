"""Anthropic Messages request models (``POST /v1/messages`` and ``/v1/messages/count_tokens``).

Shapes follow what the official ``anthropic`` SDK sends (its ``types`` package at the pinned
version). Unknown fields are ignored, as everywhere; the fields read are typed strictly.

A content block, tool or context-management edit whose ``type`` this server does not implement
parses into an ``Unsupported…`` model rather than failing here: ``serving/messages_input.py``
and ``serving/messages_request.py`` refuse it with a 400 naming its place and its type, which a
failed union match could not. Union tags are spelled ``kind[...]`` so that the HTTP layer's
error paths (``http/errors.py``) skip them like pydantic's own union member names.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag

from kimi_server.protocol.common import WireModel


def _tagger(kind: str, known: frozenset[str], *, untyped: str | None = None) -> Discriminator:
    """A discriminator that sends every unknown ``type`` to the ``unsupported`` member."""

    def tag(value: Any) -> str:
        name = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
        if name is None and untyped is not None:
            name = untyped
        return f"{kind}[{name}]" if isinstance(name, str) and name in known else f"{kind}[unsupported]"

    return Discriminator(tag)


# --- blocks -----------------------------------------------------------------------------------


class CacheControl(WireModel):
    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


class Cacheable(WireModel):
    cache_control: CacheControl | None = None


class TextBlock(Cacheable):
    type: Literal["text"]
    text: str
    citations: Any = None  # accepted; citations point into documents this server never holds


class Base64Source(WireModel):
    type: Literal["base64"]
    media_type: Literal["image/jpeg", "image/png", "image/gif", "image/webp"]
    data: str


class URLSource(WireModel):
    type: Literal["url"]
    url: str


class FileSource(WireModel):
    """Accepted only to be refused with a useful message: this server stores no files."""

    type: Literal["file"]
    file_id: str


ImageSource = Annotated[Base64Source | URLSource | FileSource, Field(discriminator="type")]


class ImageBlock(Cacheable):
    type: Literal["image"]
    source: ImageSource


class UnsupportedBlock(WireModel):
    """A block of a type this server does not implement (``document``, ``search_result``, the
    code-execution results...) or does not know; refused with its place named."""

    type: Any = None


class ToolUseBlock(Cacheable):
    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    input: dict[str, Any]


RESULT_PART_TYPES = frozenset({"text", "image"})
ToolResultPart = Annotated[
    Annotated[TextBlock, Tag("part[text]")]
    | Annotated[ImageBlock, Tag("part[image]")]
    | Annotated[UnsupportedBlock, Tag("part[unsupported]")],
    _tagger("part", RESULT_PART_TYPES),
]


class ToolResultBlock(Cacheable):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: str | list[ToolResultPart] | None = None
    is_error: bool | None = None


class ThinkingBlock(Cacheable):
    type: Literal["thinking"]
    thinking: str
    signature: str


class RedactedThinkingBlock(Cacheable):
    type: Literal["redacted_thinking"]
    data: str


class ServerToolUseBlock(Cacheable):
    type: Literal["server_tool_use"]
    id: str = Field(min_length=1)
    name: str
    input: dict[str, Any]


class WebSearchResult(WireModel):
    type: Literal["web_search_result"]
    url: str
    title: str
    encrypted_content: str
    page_age: str | None = None


class WebSearchError(WireModel):
    type: Literal["web_search_tool_result_error"]
    error_code: str


class WebSearchToolResultBlock(Cacheable):
    type: Literal["web_search_tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: list[WebSearchResult] | WebSearchError


BLOCK_TYPES = frozenset(
    {
        "text",
        "image",
        "tool_use",
        "tool_result",
        "thinking",
        "redacted_thinking",
        "server_tool_use",
        "web_search_tool_result",
    }
)
ContentBlock = Annotated[
    Annotated[TextBlock, Tag("block[text]")]
    | Annotated[ImageBlock, Tag("block[image]")]
    | Annotated[ToolUseBlock, Tag("block[tool_use]")]
    | Annotated[ToolResultBlock, Tag("block[tool_result]")]
    | Annotated[ThinkingBlock, Tag("block[thinking]")]
    | Annotated[RedactedThinkingBlock, Tag("block[redacted_thinking]")]
    | Annotated[ServerToolUseBlock, Tag("block[server_tool_use]")]
    | Annotated[WebSearchToolResultBlock, Tag("block[web_search_tool_result]")]
    | Annotated[UnsupportedBlock, Tag("block[unsupported]")],
    _tagger("block", BLOCK_TYPES),
]


class InputMessage(WireModel):
    # "system" inside messages: Claude Code sends one (the SDK's SystemMessageParam).
    role: Literal["user", "assistant", "system"]
    content: str | list[ContentBlock]


# --- tools ------------------------------------------------------------------------------------


class CustomTool(Cacheable):
    type: Literal["custom"] = "custom"
    name: str
    description: str | None = None
    input_schema: dict[str, Any]
    strict: bool | None = None
    # Anthropic loads such a tool only when its tool search finds it; here it is simply in force.
    defer_loading: bool | None = None


class UserLocation(WireModel):
    type: Literal["approximate"]
    city: str | None = None
    region: str | None = None
    country: str | None = None
    timezone: str | None = None


class WebSearchTool(Cacheable):
    type: Literal["web_search_20250305"]
    name: Literal["web_search"]
    max_uses: int | None = Field(default=None, ge=1)
    allowed_domains: list[str] | None = None
    blocked_domains: list[str] | None = None
    user_location: UserLocation | None = None
    defer_loading: bool | None = None


class UnsupportedTool(WireModel):
    """A server tool (or Anthropic-defined client tool) this server does not run."""

    type: Any = None
    name: Any = None


TOOL_TYPES = frozenset({"custom", "web_search_20250305"})
Tool = Annotated[
    Annotated[CustomTool, Tag("tool[custom]")]
    | Annotated[WebSearchTool, Tag("tool[web_search_20250305]")]
    | Annotated[UnsupportedTool, Tag("tool[unsupported]")],
    _tagger("tool", TOOL_TYPES, untyped="custom"),
]


class ToolChoiceAuto(WireModel):
    type: Literal["auto"]
    disable_parallel_tool_use: bool | None = None


class ToolChoiceAny(WireModel):
    type: Literal["any"]
    disable_parallel_tool_use: bool | None = None


class ToolChoiceTool(WireModel):
    type: Literal["tool"]
    name: str
    disable_parallel_tool_use: bool | None = None


class ToolChoiceNone(WireModel):
    type: Literal["none"]


ToolChoice = Annotated[ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool | ToolChoiceNone, Field(discriminator="type")]

# --- thinking, effort, context management ----------------------------------------------------

Display = Literal["summarized", "omitted"]


class ThinkingEnabled(WireModel):
    type: Literal["enabled"]
    budget_tokens: int
    display: Display | None = None


class ThinkingAdaptive(WireModel):
    type: Literal["adaptive"]
    display: Display | None = None


class ThinkingBetweenTools(WireModel):
    type: Literal["between_tools"]
    display: Display | None = None


class ThinkingDisabled(WireModel):
    type: Literal["disabled"]


Thinking = Annotated[
    ThinkingEnabled | ThinkingAdaptive | ThinkingBetweenTools | ThinkingDisabled, Field(discriminator="type")
]


class JSONOutputFormat(WireModel):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(WireModel):
    effort: str | None = None
    format: JSONOutputFormat | None = None


class ClearThinking(WireModel):
    type: Literal["clear_thinking_20251015"]
    # "all", {"type": "all"} or {"type": "thinking_turns", "value": N}: read in
    # serving/messages_request.py, whose errors name the part at fault.
    keep: Any = None


class UnsupportedEdit(WireModel):
    """An edit that would clear content this server does not (tool uses, compaction)."""

    type: Any = None


EDIT_TYPES = frozenset({"clear_thinking_20251015"})
Edit = Annotated[
    Annotated[ClearThinking, Tag("edit[clear_thinking_20251015]")]
    | Annotated[UnsupportedEdit, Tag("edit[unsupported]")],
    _tagger("edit", EDIT_TYPES),
]


class ContextManagement(WireModel):
    edits: list[Edit] | None = None


class Metadata(WireModel):
    user_id: str | None = None


# --- the requests -----------------------------------------------------------------------------


class CountTokensRequest(WireModel):
    """``POST /v1/messages/count_tokens``: what ``create`` takes, less what only shapes the output."""

    model: str
    messages: list[InputMessage]
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = Field(default=None, max_length=128)
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    context_management: ContextManagement | None = None
    # Anthropic: marks the last cacheable block; here it only asks for the cache's TTL.
    cache_control: CacheControl | None = None
    # Refused where set: ignoring them would change the answer.
    mcp_servers: list[Any] | None = None
    container: Any = None


class MessagesRequest(CountTokensRequest):
    max_tokens: int
    stream: bool | None = False
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    metadata: Metadata | None = None
    # Hints, accepted and ignored (docs/contract-messages.md).
    service_tier: str | None = None
