"""Upstream chunks -> the engine events the serving core understands.

Whatever shape the upstream uses for reasoning (``reasoning_content``, ``reasoning``, inline
``<think>`` tags), tool calls (deltas, or Kimi's markup left in the text), finish reasons and
usage, the events come out the same. Works on plain dicts: no model building per chunk.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, replace
from typing import Any

from kimi_server.engines.types import (
    ContentDelta,
    EngineEvent,
    Finish,
    FinishReason,
    ReasoningDelta,
    ToolCallDelta,
    Usage,
    UsageSource,
)
from kimi_server.engines.upstream.markup import KimiToolMarkup, Part, ThinkSplitter
from kimi_server.engines.web_search_tool import WEB_SEARCH_NAME


@dataclass(frozen=True)
class Counts:
    """Tokens the server counted itself (engines/upstream/counting.py)."""

    prompt: int
    completion: int
    reasoning: int
    source: UsageSource


FINISH: dict[str, FinishReason] = {
    "stop": "stop",
    "length": "length",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "content_filter": "stop",
    "eos": "stop",
}


class Normaliser:
    def __init__(self, *, report_cache: bool, separate_writes: bool) -> None:
        self._think = ThinkSplitter()
        self._markup = KimiToolMarkup()
        self._indexes: dict[int, int] = {}  # upstream tool-call index -> ours
        self._held: dict[int, ToolCallDelta] = {}  # calls whose name has not arrived yet
        self._report_cache = report_cache
        self._separate_writes = separate_writes
        self.finish_reason: str | None = None
        self.stop_word: str | None = None  # the stop string that ended the answer, if told
        self.usage: dict[str, Any] | None = None
        self.pieces = 0  # output deltas seen: a floor on the tokens generated
        self.reasoning_pieces = 0
        self.calls = 0

    def feed(self, chunk: dict[str, Any]) -> list[EngineEvent]:
        delta = self._delta(chunk)
        if not delta:
            return []
        out: list[EngineEvent] = []
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            self.pieces += 1
            self.reasoning_pieces += 1
            out.append(ReasoningDelta(reasoning))
        content = delta.get("content")
        if isinstance(content, str) and content:
            self.pieces += 1
            if "<" not in content and self._think.plain and self._markup.idle():
                # Plain text once the stream is known to be plain: no tag can start in it.
                out.append(ContentDelta(content))
            else:
                out += self._text(self._think.feed(content))
        calls = delta.get("tool_calls")
        for call in calls if isinstance(calls, list) else ():
            out += self._tool_delta(call)
        return out

    def _delta(self, chunk: dict[str, Any]) -> dict[str, Any] | None:
        """The chunk's first choice's delta (or whole message); its usage and finish reason
        noted on the way."""
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        choices = chunk.get("choices")
        if not choices or not isinstance(choices, list):
            return None
        choice = choices[0]
        if not isinstance(choice, dict):
            return None
        if isinstance(choice.get("usage"), dict):  # Moonshot puts it on the last choice
            self.usage = choice["usage"]
        if choice.get("finish_reason"):
            self.finish_reason = str(choice["finish_reason"])
            self.stop_word = _stop_word(chunk, choice)
        delta = choice.get("delta") or choice.get("message") or {}
        return delta if isinstance(delta, dict) else None

    def _text(self, parts: list[Part]) -> list[EngineEvent]:
        out: list[EngineEvent] = []
        for kind, text in parts:
            if kind == "reasoning":
                self.reasoning_pieces += 1
                out.append(ReasoningDelta(text))
                continue
            self._markup.next_index = self.calls
            plain, calls = self._markup.feed(text)
            if plain:
                out.append(ContentDelta(plain))
            self.calls = self._markup.next_index
            out += calls
        return out

    def _tool_delta(self, call: Any) -> list[EngineEvent]:
        if not isinstance(call, dict):
            return []
        upstream_index = call.get("index", len(self._indexes))
        fn = call.get("function") or {}
        name, args = fn.get("name"), fn.get("arguments") or ""
        if not isinstance(args, str):
            args = str(args)
        ours = self._indexes.get(upstream_index)
        if ours is None:
            ours = self._indexes[upstream_index] = self.calls
            self.calls += 1
            self._held[ours] = ToolCallDelta(ours, call.get("id") or f"call_{secrets.token_hex(12)}", None, "")
        held = self._held.get(ours)
        if held is not None:
            # The first event of a call must carry its id and name; hold it until the name comes.
            held = ToolCallDelta(ours, held.id, held.name or name, held.arguments + args)
            if not held.name:
                self._held[ours] = held
                return []
            del self._held[ours]
            self.pieces += 1
            if held.name == WEB_SEARCH_NAME:  # the client echoes it; kimi-server searches
                held = replace(held, kind="builtin_function")
            return [held]
        self.pieces += 1
        return [ToolCallDelta(ours, arguments=args)] if args else []

    def finish(self) -> list[EngineEvent]:
        """Whatever was held back, then the Finish event."""
        out = self._text(self._think.flush())
        self._markup.next_index = self.calls
        rest = self._markup.flush()
        if rest:
            out.append(ContentDelta(rest))
        reason = FINISH.get(self.finish_reason or "stop", "stop")
        if self.calls and reason != "length":
            reason = "tool_calls"
        out.append(Finish(reason, self._usage(), self.stop_word if reason == "stop" else None))
        return out

    def missing_counts(self) -> tuple[bool, bool]:
        """Whether the upstream left out its prompt count, its output count (most servers send
        usage only when asked, and some never do)."""
        u = self.usage or {}
        return _int(u.get("prompt_tokens")) == 0, not isinstance(u.get("completion_tokens"), int)

    def counted_usage(self, counts: Counts) -> Usage:
        """The usage with the server's own counts where the upstream reported none."""
        return self._usage(counts)

    def _usage(self, counted: Counts | None = None) -> Usage:
        u = self.usage or {}
        prompt = _int(u.get("prompt_tokens"))
        completion = _int(u.get("completion_tokens")) or self.pieces
        counted_reasoning = None
        if counted is not None:
            no_prompt, no_completion = self.missing_counts()
            prompt = counted.prompt if no_prompt else prompt
            if no_completion:
                # Each streamed delta is at least one generated token; text tokenized again can
                # merge across deltas, so the deltas are a floor under the count.
                completion = max(counted.completion, self.pieces)
                counted_reasoning = max(counted.reasoning, self.reasoning_pieces)
        details = u.get("prompt_tokens_details") or {}
        cached = _int(details.get("cached_tokens") if isinstance(details, dict) else None)
        cached = cached or _int(u.get("cached_tokens"))  # Moonshot's top-level field
        written = _int(details.get("cache_write_tokens") if isinstance(details, dict) else None)
        out_details = u.get("completion_tokens_details") or {}
        reasoning = _int(out_details.get("reasoning_tokens") if isinstance(out_details, dict) else None)
        if counted_reasoning is not None:
            reasoning = min(counted_reasoning, completion)
        elif not reasoning and self.reasoning_pieces:
            # Not reported: one streamed delta is about one token.
            reasoning = min(self.reasoning_pieces, completion)
        if not self._report_cache:
            cached = written = 0
        elif self._separate_writes and not written:
            written = max(prompt - cached, 0)
        elif not self._separate_writes:
            written = 0
        source: UsageSource = "engine" if counted is None else counted.source
        return Usage(prompt, cached, written, completion, reasoning, source=source)


def _stop_word(chunk: dict[str, Any], choice: dict[str, Any]) -> str | None:
    """The stop string a finished choice names, where the upstream says: vLLM's ``stop_reason``
    (an int there is a stop token's id, not a string), llama.cpp's ``stopping_word`` (in the
    result it adds under ``__verbose`` when asked)."""
    verbose = chunk.get("__verbose")
    native = verbose.get("stopping_word") if isinstance(verbose, dict) else None
    for word in (choice.get("stop_reason"), native):
        if isinstance(word, str) and word:
            return word
    return None


def _int(value: Any) -> int:
    return value if isinstance(value, int) and value >= 0 else 0
