"""Text-level repairs for what an engine may leak into ``content``: inline thinking tags and
Kimi's own tool-call markup (when the upstream runs without its reasoning or tool-call parser).
Both work on a stream, holding back only a possible partial tag."""

from __future__ import annotations

import secrets
from typing import Literal

from kimi_server.engines.types import ToolCallDelta
from kimi_server.engines.web_search_tool import WEB_SEARCH_NAME
from kimi_server.parsers.partial import partial_suffix
from kimi_server.parsers.reasoning import ReasoningFormat, ThinkTagSplitter

Part = tuple[Literal["reasoning", "content"], str]

THINK_FORMATS = (
    ReasoningFormat("think-tags", "native", "<think>", "</think>"),
    ReasoningFormat("kimi-think", "native", "\u25c1think\u25b7", "\u25c1/think\u25b7"),  # ◁think▷
)

SECTION_BEGIN = ("<|tool_calls_section_begin|>", "<|tool_call_begin|>")
CALL_BEGIN = "<|tool_call_begin|>"
ARGS_BEGIN = "<|tool_call_argument_begin|>"
CALL_END = "<|tool_call_end|>"
SECTION_END = "<|tool_calls_section_end|>"


class ThinkSplitter:
    """Picks the thinking-tag style from the first non-blank text, then splits at its tags."""

    def __init__(self) -> None:
        self._pending = ""
        self._inner: ThinkTagSplitter | None = None
        self._plain = False

    def feed(self, text: str) -> list[Part]:
        if self._plain:
            return [("content", text)] if text else []
        if self._inner is not None:
            return self._inner.feed(text)
        self._pending += text
        head = self._pending.lstrip()
        if not head:
            return []
        for fmt in THINK_FORMATS:
            if head.startswith(fmt.opener):
                self._inner = ThinkTagSplitter(fmt)
                pending, self._pending = self._pending, ""
                return self._inner.feed(pending)
        if any(fmt.opener.startswith(head) for fmt in THINK_FORMATS):
            return []
        self._plain = True
        pending, self._pending = self._pending, ""
        return [("content", pending)]

    @property
    def plain(self) -> bool:
        """The stream started without a thinking tag: every later text is content as it is."""
        return self._plain

    def flush(self) -> list[Part]:
        if self._inner is not None:
            return self._inner.flush()
        pending, self._pending = self._pending, ""
        return [("content", pending)] if pending else []


class KimiToolMarkup:
    """Pulls ``<|tool_call_begin|>functions.NAME:N<|tool_call_argument_begin|>ARGS<|tool_call_end|>``
    out of the content stream as tool calls; the text around them stays content."""

    def __init__(self, first_index: int = 0) -> None:
        self._buf = ""
        self._in_section = False
        self.next_index = first_index

    def idle(self) -> bool:
        """Nothing held back and outside a section: text without '<' passes unchanged."""
        return not self._buf and not self._in_section

    def feed(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        self._buf += text
        content: list[str] = []
        calls: list[ToolCallDelta] = []
        while self._buf:
            if not self._in_section:
                hits = [(i, tag) for tag in SECTION_BEGIN if (i := self._buf.find(tag)) >= 0]
                if hits:
                    i, tag = min(hits)
                    content.append(self._buf[:i])
                    # A bare call tag opens an implicit section and is kept for the call parser.
                    self._buf = self._buf[i + len(tag) :] if tag != CALL_BEGIN else self._buf[i:]
                    self._in_section = True
                    continue
                # Fast path: text with no '<' near its end cannot be the start of a tag.
                keep = partial_suffix(self._buf, *SECTION_BEGIN) if "<" in self._buf[-28:] else 0
                content.append(self._buf[: len(self._buf) - keep])
                self._buf = self._buf[len(self._buf) - keep :]
                break
            end = self._buf.find(CALL_END)
            section_end = self._buf.find(SECTION_END)
            if section_end >= 0 and (end < 0 or section_end < end):
                self._buf = self._buf[section_end + len(SECTION_END) :]
                self._in_section = False
                continue
            if end < 0:
                break
            call = self._parse(self._buf[:end])
            self._buf = self._buf[end + len(CALL_END) :]
            if call is not None:
                calls.append(call)
        return "".join(content), calls

    def _parse(self, raw: str) -> ToolCallDelta | None:
        body = raw.split(CALL_BEGIN, 1)[-1]
        header, sep, args = body.partition(ARGS_BEGIN)
        if not sep:
            return None
        name = header.strip().rsplit(":", 1)[0].split(".")[-1]
        if not name:
            return None
        index = self.next_index
        self.next_index += 1
        kind: Literal["function", "builtin_function"] = "builtin_function" if name == WEB_SEARCH_NAME else "function"
        return ToolCallDelta(index, f"call_{secrets.token_hex(12)}", name, args.strip(), kind)

    def flush(self) -> str:
        """What is left at the end: text, unless it was an unfinished call (dropped)."""
        rest, self._buf = self._buf, ""
        return "" if self._in_section else rest
