"""Internal request and event types that connect the endpoints to the engines.

Frozen dataclasses: the endpoints build one ``GenerationRequest``; an engine yields
``EngineEvent``s for it. Nothing here knows about HTTP or which endpoint is calling.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

Role = Literal["system", "user", "assistant", "tool"]
FinishReason = Literal["stop", "length", "tool_calls"]


@dataclass(frozen=True)
class ToolCallRecord:
    id: str
    name: str
    arguments: str
    kind: Literal["function", "builtin_function", "custom"] = "function"


@dataclass(frozen=True)
class ContentPart:
    """One part of a message's content: a text, or an image's or a video's URL."""

    kind: Literal["text", "image", "video"]
    value: str


@dataclass(frozen=True)
class Message:
    role: Role
    text: str = ""  # the text parts, joined by line breaks
    images: tuple[str, ...] = ()
    videos: tuple[str, ...] = ()
    reasoning: str | None = None
    tool_calls: tuple[ToolCallRecord, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    # Tools a system message declares ("dynamic tools"): callable from this point on. Each is
    # also in GenerationRequest.tools, the union in force; here they say where to render them.
    tools: tuple[ToolSpec, ...] = ()
    # The content in the client's order where media are among it (an engine that can place an
    # image between two texts reads this); empty for text alone. text/images/videos hold the
    # same content by kind, for engines that take it so: ``of_parts`` sets all four.
    parts: tuple[ContentPart, ...] = ()

    @classmethod
    def of_parts(cls, role: Role, parts: Iterable[ContentPart], **fields: Any) -> Message:
        ordered = tuple(parts)
        media = any(p.kind != "text" for p in ordered)
        return cls(
            role,
            "\n".join(p.value for p in ordered if p.kind == "text"),
            images=tuple(p.value for p in ordered if p.kind == "image"),
            videos=tuple(p.value for p in ordered if p.kind == "video"),
            parts=ordered if media else (),
            **fields,
        )

    def with_media_urls(self, urls: Mapping[str, str]) -> Message:
        """The same message with each media URL found in ``urls`` replaced by its value there."""
        if not (self.images or self.videos):
            return self
        return replace(
            self,
            images=tuple(urls.get(u, u) for u in self.images),
            videos=tuple(urls.get(u, u) for u in self.videos),
            parts=tuple(p if p.kind == "text" else ContentPart(p.kind, urls.get(p.value, p.value)) for p in self.parts),
        )


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool = False
    kind: Literal["function", "custom", "web_search"] = "function"
    # The request field that declared it, for errors (``messages[2].tools[0].function``);
    # None: ``tools[i]``. Not part of the tool's identity.
    where: str | None = field(default=None, compare=False)


@dataclass(frozen=True)
class ToolChoice:
    mode: Literal["auto", "none", "required", "named"] = "auto"
    name: str | None = None


@dataclass(frozen=True)
class OutputFormat:
    kind: Literal["text", "json_object", "json_schema"] = "text"
    schema: dict[str, Any] | None = None
    name: str | None = None
    strict: bool = True


@dataclass(frozen=True)
class AnswerPrefix:
    """Partial Mode: the text the answer starts with, which the model continues (the client's
    last assistant message). Not among the request's messages; the answer's content excludes it."""

    text: str
    name: str | None = None  # the character the model speaks as (role-play)
    param: str = "partial"  # the request field that carried it, for errors


@dataclass(frozen=True)
class ReasoningBudget:
    """Tokens of reasoning: at least ``floor`` (the model may not stop earlier), at most ``cap``."""

    floor: int
    cap: int


@dataclass(frozen=True)
class CachePolicy:
    ttl_seconds: int = 300
    namespace: str = "default"
    separate_writes: bool = True
    ttl_label: str = "5m"


@dataclass(frozen=True)
class GenerationRequest:
    model: str
    messages: tuple[Message, ...]
    effort: str
    budget: ReasoningBudget
    max_output_tokens: int
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: ToolChoice = field(default_factory=ToolChoice)
    parallel_tool_calls: bool = True
    output_format: OutputFormat = field(default_factory=OutputFormat)
    cache: CachePolicy = field(default_factory=CachePolicy)
    stop: tuple[str, ...] = ()
    seed: int | None = None
    # The request field that carried the conversation, named by a too-long-prompt error.
    prompt_param: str = "messages"
    # False: no reasoning phase at all (a contract whose thinking switch the client turned off).
    reasoning: bool = True
    # Who the request is for, as the client names its own end user (chat's ``user``, Messages'
    # ``metadata.user_id``): kept in the ledger, never sent to an engine.
    end_user: str | None = None
    # Partial Mode: the answer continues this prefix (every engine honours it or refuses it).
    answer_prefix: AnswerPrefix | None = None


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    # Searches the server ran for this request; not on the wire, for ledgers.
    web_search_calls: int = 0
    # Who counted: not on the wire, for ledgers (see UsageSource).
    source: UsageSource = "engine"

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: Usage) -> Usage:
        """Several engine calls of one request (search rounds): every call counts, and the sum
        is only as exact as its least exact part."""
        return Usage(
            self.prompt_tokens + other.prompt_tokens,
            self.cached_tokens + other.cached_tokens,
            self.cache_write_tokens + other.cache_write_tokens,
            self.completion_tokens + other.completion_tokens,
            self.reasoning_tokens + other.reasoning_tokens,
            self.web_search_calls + other.web_search_calls,
            max(self.source, other.source, key=_SOURCE_ORDER.index),
        )


# "engine": the engine reported its counts. "server_count": the engine reported none, and the
# server counted with the model's tokenizer. "server_estimate": no tokenizer was at hand (or the
# request was cut off), and the server estimated on the generous side.
UsageSource = Literal["engine", "server_count", "server_estimate"]
_SOURCE_ORDER: tuple[UsageSource, ...] = ("engine", "server_count", "server_estimate")


@dataclass(frozen=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True)
class ContentDelta:
    text: str


@dataclass(frozen=True)
class ToolCallDelta:
    """A tool call as it streams: the first delta for an index carries id and name."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""
    kind: Literal["function", "builtin_function", "custom"] = "function"


@dataclass(frozen=True)
class Finish:
    reason: FinishReason
    usage: Usage
    # Which of the request's stop strings ended the answer, where the engine can tell (reason
    # "stop"); None: the model ended its turn, or the engine does not report it.
    stop_sequence: str | None = None
    # Reason "length" because the embedded engine's repetition guard stopped a looping call,
    # not because the output cap or the context ran out.
    looped: bool = False


EngineEvent = ReasoningDelta | ContentDelta | ToolCallDelta | Finish
