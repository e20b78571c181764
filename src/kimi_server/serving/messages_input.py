"""Messages ``system`` and ``messages`` -> the conversation as internal Messages.

An assistant message's blocks become one assistant Message (its reasoning restored from the
sealed thinking ``signature``), except where a web search sent back splits it: the round that
searched, the search's result as the tool message the model read, and the rest. A user message's
``tool_result`` blocks become tool messages, its text and images one user Message.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from kimi_server.engines.types import Message, ToolCallRecord
from kimi_server.engines.web_search_tool import WEB_SEARCH_NAME
from kimi_server.errors import InvalidRequestError
from kimi_server.media.intake import Part
from kimi_server.protocol.messages import (
    Base64Source,
    ContentBlock,
    CountTokensRequest,
    FileSource,
    ImageBlock,
    InputMessage,
    RedactedThinkingBlock,
    ServerToolUseBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    URLSource,
    WebSearchToolResultBlock,
)
from kimi_server.search.base import SearchHit, SearchOutcome
from kimi_server.search.searcher import as_tool_text
from kimi_server.serving.sealing import Sealer

# What a sealed web search result holds (its text as the model read it); a blob sealed for one
# purpose does not open as another (serving/sealing.py).
RESULT_SEAL = "web-search-result"
ALLOWED = {
    "user": ("text", "image", "tool_result"),
    "system": ("text",),
    "assistant": ("text", "thinking", "redacted_thinking", "tool_use", "server_tool_use", "web_search_tool_result"),
}
# Anthropic block types that exist but that this server does not implement.
KNOWN_ELSEWHERE = frozenset(
    {
        "document",
        "search_result",
        "web_fetch_tool_result",
        "code_execution_tool_result",
        "bash_code_execution_tool_result",
        "text_editor_code_execution_tool_result",
        "tool_search_tool_result",
        "container_upload",
        "tool_reference",
        "browser_state",
    }
)


def image_url(source: Base64Source | URLSource | FileSource, where: str) -> str:
    """The URL the media checks and the engine take: base64 data as a ``data:`` URL."""
    if isinstance(source, Base64Source):
        return f"data:{source.media_type};base64,{source.data}"
    if isinstance(source, URLSource):
        return source.url
    raise InvalidRequestError(
        f"'{where}.source' names a file ({source.file_id!r}); this server stores no files: send the "
        "image as base64 data or a URL.",
        param=f"{where}.source",
        code="unsupported_content",
    )


def unsupported_block(kind: object, where: str, *, role: str | None = None) -> InvalidRequestError:
    if role is not None and isinstance(kind, str) and kind in ALLOWED["assistant"] + ALLOWED["user"]:
        allowed = ", ".join(repr(a) for a in ALLOWED[role])
        message = f"Invalid '{where}.type': a '{role}' message may contain only {allowed} blocks, not {kind!r}."
    elif isinstance(kind, str) and kind in KNOWN_ELSEWHERE:
        message = f"'{where}' is a '{kind}' block, which this server does not support."
    elif kind is None:
        message = f"Missing required parameter: '{where}.type'."
    else:
        message = f"Invalid '{where}.type': {str(kind)[:60]!r} is not a content block type this server knows."
    return InvalidRequestError(message, param=f"{where}.type", code="unsupported_content")


def media_parts(body: CountTokensRequest) -> list[Part]:
    """Every image of the request, named as the client wrote it, for the media checks (the URLs
    are those the conversation carries, so ``media.intake.apply`` finds them)."""
    out: list[Part] = []
    for i, message in enumerate(body.messages):
        if isinstance(message.content, str):
            continue
        for j, block in enumerate(message.content):
            where = f"messages[{i}].content[{j}]"
            if isinstance(block, ImageBlock) and not isinstance(block.source, FileSource):
                out.append((where, "image", image_url(block.source, where)))
            elif isinstance(block, ToolResultBlock) and isinstance(block.content, list):
                for k, part in enumerate(block.content):
                    if isinstance(part, ImageBlock) and not isinstance(part.source, FileSource):
                        at = f"{where}.content[{k}]"
                        out.append((at, "image", image_url(part.source, at)))
    return out


@dataclass
class _Segment:
    """One assistant Message in the making."""

    reasoning: list[str] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    calls: list[ToolCallRecord] = field(default_factory=list)

    def message(self) -> Message | None:
        if not (self.reasoning or self.texts or self.calls):
            return None
        reasoning = "\n".join(self.reasoning) if self.reasoning else None
        return Message("assistant", "\n".join(self.texts), reasoning=reasoning, tool_calls=tuple(self.calls))


@dataclass
class Converter:
    """``keep_thinking_from``: the wire index of the first message whose thinking is kept (a
    ``clear_thinking`` edit drops that of older turns); 0 keeps all."""

    sealer: Sealer
    key_id: str
    accepts_images: bool
    keep_thinking_from: int = 0
    out: list[Message] = field(default_factory=list)
    queries: dict[str, str] = field(default_factory=dict)  # server_tool_use id -> its query

    def system(self, system: str | list[TextBlock] | None) -> None:
        if isinstance(system, str):
            self.out.append(Message("system", system))
        elif system:
            self.out.append(Message("system", "\n\n".join(b.text for b in system)))

    def message(self, index: int, message: InputMessage) -> None:
        where = f"messages[{index}]"
        if isinstance(message.content, str):
            self.out.append(Message(message.role, message.content))
            return
        for j, block in enumerate(message.content):
            if block.type not in ALLOWED[message.role]:
                raise unsupported_block(block.type, f"{where}.content[{j}]", role=message.role)
        if message.role == "assistant":
            self._assistant(index, message.content)
        else:
            self._user_or_system(index, message.role, message.content)

    # --- user and system ----------------------------------------------------------------------

    def _user_or_system(self, index: int, role: str, blocks: list[ContentBlock]) -> None:
        texts: list[str] = []
        images: list[str] = []
        for j, block in enumerate(blocks):
            where = f"messages[{index}].content[{j}]"
            if isinstance(block, TextBlock):
                texts.append(block.text)
            elif isinstance(block, ImageBlock):
                images.append(self._image(block, where))
            elif isinstance(block, ToolResultBlock):
                if texts or images:  # text before a result is a turn of its own
                    self.out.append(Message("user", "\n".join(texts), images=tuple(images)))
                    texts, images = [], []
                self.out.append(self._tool_result(block, where))
        if texts or images or not blocks:
            self.out.append(Message("system" if role == "system" else "user", "\n".join(texts), images=tuple(images)))

    def _image(self, block: ImageBlock, where: str) -> str:
        if not self.accepts_images:
            raise InvalidRequestError(
                f"This model cannot see images: '{where}' is an image block. Send text only: the "
                "models this server runs read text.",
                param=where,
                code="unsupported_content",
            )
        return image_url(block.source, where)

    def _tool_result(self, block: ToolResultBlock, where: str) -> Message:
        texts: list[str] = []
        images: list[str] = []
        if isinstance(block.content, str):
            texts.append(block.content)
        for k, part in enumerate(block.content if isinstance(block.content, list) else ()):
            at = f"{where}.content[{k}]"
            if isinstance(part, TextBlock):
                texts.append(part.text)
            elif isinstance(part, ImageBlock):
                images.append(self._image(part, at))
            else:
                raise unsupported_block(part.type, at)
        text = "\n".join(texts)
        if block.is_error:
            # The model must know the call failed; the tool message itself has no such flag.
            text = f"Error: {text}" if text else "Error"
        return Message("tool", text, images=tuple(images), tool_call_id=block.tool_use_id)

    # --- assistant ----------------------------------------------------------------------------

    def _assistant(self, index: int, blocks: list[ContentBlock]) -> None:
        keep_thinking = index >= self.keep_thinking_from
        segment = _Segment()
        for j, block in enumerate(blocks):
            where = f"messages[{index}].content[{j}]"
            if isinstance(block, ThinkingBlock | RedactedThinkingBlock):
                reasoning = self._reasoning(block, where) if keep_thinking else None
                if reasoning is not None:
                    if segment.texts or segment.calls:
                        segment = self._flush(segment)  # thinking after an answer opens a new one
                    segment.reasoning.append(reasoning)
            elif isinstance(block, TextBlock):
                segment.texts.append(block.text)
            elif isinstance(block, ToolUseBlock):
                arguments = json.dumps(block.input, ensure_ascii=False)
                segment.calls.append(ToolCallRecord(block.id, block.name, arguments))
            elif isinstance(block, ServerToolUseBlock):
                segment.calls.append(self._search_call(block, where))
            elif isinstance(block, WebSearchToolResultBlock):
                segment = self._flush(segment)
                self.out.append(Message("tool", self._search_text(block), tool_call_id=block.tool_use_id))
        self._flush(segment)

    def _flush(self, segment: _Segment) -> _Segment:
        message = segment.message()
        if message is not None:
            self.out.append(message)
        return _Segment()

    def _reasoning(self, block: ThinkingBlock | RedactedThinkingBlock, where: str) -> str | None:
        if isinstance(block, RedactedThinkingBlock):
            # This server never redacts: such a block comes from another provider's turn, whose
            # hidden reasoning nobody here can read. One that opens as ours is used.
            return self._open(block.data, "reasoning")
        sealed = self._open(block.signature, "reasoning")
        if sealed is None:
            raise InvalidRequestError(
                f"'{where}.signature' could not be verified: it was altered, or it was not issued by "
                "this server for this API key. Send thinking blocks exactly as they were returned, or "
                "leave them out.",
                param=f"{where}.signature",
                code="invalid_signature",
            )
        if block.thinking and block.thinking != sealed:
            raise InvalidRequestError(
                f"'{where}.thinking' differs from the thinking its signature was issued for. Send "
                "it unchanged (or empty, as returned when the display is omitted).",
                param=f"{where}.thinking",
                code="invalid_signature",
            )
        return sealed

    def _open(self, blob: str, purpose: str) -> str | None:
        try:
            return self.sealer.open(blob, key_id=self.key_id, param="signature", purpose=purpose)
        except InvalidRequestError:
            return None

    def _search_call(self, block: ServerToolUseBlock, where: str) -> ToolCallRecord:
        if block.name != "web_search":
            raise InvalidRequestError(
                f"'{where}' is a '{block.name}' server tool call; the only server tool here is 'web_search'.",
                param=f"{where}.name",
                code="unsupported_tool",
            )
        query = block.input.get("query")
        self.queries[block.id] = query if isinstance(query, str) else ""
        arguments = json.dumps({"query": self.queries[block.id]}, ensure_ascii=False)
        return ToolCallRecord(block.id, WEB_SEARCH_NAME, arguments, kind="builtin_function")

    def _search_text(self, block: WebSearchToolResultBlock) -> str:
        """The results as the model read them when it searched: title and URL as sent, each text
        from its sealed ``encrypted_content`` (none from a blob that is not ours)."""
        query = self.queries.get(block.tool_use_id, "")
        if not isinstance(block.content, list):
            return as_tool_text(SearchOutcome(query, error=block.content.error_code))
        hits = tuple(
            SearchHit(r.title, r.url, self._open(r.encrypted_content, RESULT_SEAL) or "") for r in block.content
        )
        return as_tool_text(SearchOutcome(query, hits))


def convert(
    body: CountTokensRequest,
    *,
    sealer: Sealer,
    key_id: str,
    accepts_images: bool,
    keep_thinking_from: int = 0,
) -> list[Message]:
    converter = Converter(sealer, key_id, accepts_images, keep_thinking_from)
    converter.system(body.system)
    for i, message in enumerate(body.messages):
        converter.message(i, message)
    return converter.out
