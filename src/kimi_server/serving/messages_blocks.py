"""The content blocks of a Messages answer and their stream events: thinking (its text streamed
unless omitted, its reasoning sealed into the ``signature``), text, and tool_use (its input
streamed as ``input_json_delta``, parsed at the end). One block is open at a time, each opened,
added to and closed with its ``index``; ``messages.py`` drives them from the engine's events.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import jiter

from kimi_server.engines.types import ToolCallDelta
from kimi_server.errors import APIError
from kimi_server.serving.common import new_id
from kimi_server.serving.messages_request import MessagesPlan
from kimi_server.serving.sealing import Sealer

Event = tuple[str, dict[str, Any]]  # (SSE event name, its data)


class ToolInputError(APIError):
    """The model's finished tool input is not a JSON object (constrained decoding makes this
    rare; an upstream may still send junk). The answer fails as a bad gateway rather than hand
    the client a guess."""

    status_code = 502
    default_code = "invalid_tool_input"

    def __init__(self, name: str) -> None:
        super().__init__(
            f"The model produced input for the tool {name!r} that is not a JSON object; retry the request."
        )


@dataclass
class _Block:
    index: int
    kind: str  # "thinking" | "text" | "tool_use"
    parts: list[str] = field(default_factory=list)  # thinking or text so far; a call's input JSON
    id: str = ""
    name: str = ""

    @property
    def text(self) -> str:
        return "".join(self.parts)


@dataclass
class ContentBlocks:
    plan: MessagesPlan
    sealer: Sealer
    blocks: list[dict[str, Any]] = field(default_factory=list)  # finished blocks, in order
    current: _Block | None = None
    calls: dict[int, _Block] = field(default_factory=dict)  # the engine's call index -> its block
    # The round has answered (text or a call): reasoning after that has no block to join.
    answered: bool = False

    def _start(self, kind: str, block: dict[str, Any], *, id: str = "", name: str = "") -> list[Event]:
        out = self._close()
        self.current = _Block(len(self.blocks), kind, id=id, name=name)
        self.blocks.append(block)  # a placeholder, replaced by the finished block
        data = {"type": "content_block_start", "index": self.current.index, "content_block": block}
        return [*out, ("content_block_start", data)]

    @staticmethod
    def _delta(index: int, delta: dict[str, Any]) -> Event:
        return ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})

    def _close(self) -> list[Event]:
        b = self.current
        if b is None:
            return []
        self.current = None
        out: list[Event] = []
        if b.kind == "thinking":
            signature = self.sealer.seal(b.text, key_id=self.plan.key_id)
            out.append(self._delta(b.index, {"type": "signature_delta", "signature": signature}))
            shown = b.text if self.plan.show_thinking else ""
            self.blocks[b.index] = {"type": "thinking", "thinking": shown, "signature": signature}
        elif b.kind == "text":
            self.blocks[b.index] = {"type": "text", "text": b.text}
        else:
            self.blocks[b.index] = {"type": "tool_use", "id": b.id, "name": b.name, "input": {}}
        out.append(("content_block_stop", {"type": "content_block_stop", "index": b.index}))
        return out

    # --- engine events ------------------------------------------------------------------------

    def reasoning_delta(self, text: str) -> list[Event]:
        if not text or self.answered or not self.plan.gen.reasoning:
            return []
        out: list[Event] = []
        if self.current is None or self.current.kind != "thinking":
            out += self._start("thinking", {"type": "thinking", "thinking": "", "signature": ""})
        assert self.current is not None
        self.current.parts.append(text)
        if self.plan.show_thinking:
            out.append(self._delta(self.current.index, {"type": "thinking_delta", "thinking": text}))
        return out

    def content_delta(self, text: str) -> list[Event]:
        if not text:
            return []
        self.answered = True
        out: list[Event] = []
        if self.current is None or self.current.kind != "text":
            out += self._start("text", {"type": "text", "text": ""})
        assert self.current is not None
        self.current.parts.append(text)
        out.append(self._delta(self.current.index, {"type": "text_delta", "text": text}))
        return out

    def call_delta(self, delta: ToolCallDelta) -> list[Event]:
        self.answered = True
        out: list[Event] = []
        call = self.calls.get(delta.index)
        if call is None:
            # Ids of our own: upstreams name calls in ways Anthropic clients may not send back.
            name, call_id = delta.name or "", new_id("toolu_")
            block = {"type": "tool_use", "id": call_id, "name": name, "input": {}}
            out += self._start("tool_use", block, id=call_id, name=name)
            assert self.current is not None
            call = self.calls[delta.index] = self.current
        if delta.arguments:
            call.parts.append(delta.arguments)
            out.append(self._delta(call.index, {"type": "input_json_delta", "partial_json": delta.arguments}))
        return out

    def text_if_empty(self) -> list[Event]:
        """A finished answer always carries its answer: an empty text block when it has none."""
        if any(b["type"] in ("text", "tool_use") for b in self.blocks):
            return []
        return [*self._start("text", {"type": "text", "text": ""}), *self._close()]

    def close_all(self, *, cut: bool = False) -> list[Event]:
        """Closes the open block, and gives each tool_use block its parsed input. A call the
        output cap cut keeps what its input holds so far, as Anthropic's own SDK rebuilds it
        from the stream (``stop_reason`` says ``max_tokens``)."""
        out = self._close()
        for call in self.calls.values():
            self.blocks[call.index]["input"] = _partial(call) if cut else _parsed(call)
        return out


def _partial(call: _Block) -> dict[str, Any]:
    try:
        value = jiter.from_json(call.text.encode(), partial_mode="trailing-strings")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _parsed(call: _Block) -> dict[str, Any]:
    if not call.text.strip():
        return {}  # a call without arguments
    try:
        value = json.loads(call.text)
    except ValueError:
        raise ToolInputError(call.name) from None
    if not isinstance(value, dict):
        raise ToolInputError(call.name)
    return value
