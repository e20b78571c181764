"""Anthropic's Message object as its SDKs read it, and the same message rebuilt from its event
stream the way their accumulators rebuild it: every rule below is one a client relies on."""

from __future__ import annotations

import json
from typing import Any

from kimi_server.verify.anthropic import Event
from kimi_server.verify.outcome import Failed, expect

STOP_REASONS = ("end_turn", "max_tokens", "stop_sequence", "tool_use", "pause_turn", "refusal")
REASONING = ("thinking", "redacted_thinking")
BLOCKS = (*REASONING, "text", "tool_use", "server_tool_use", "web_search_tool_result")
COUNTS = ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
# Which deltas each block takes while it streams.
DELTAS = {
    "thinking": ("thinking_delta", "signature_delta"),
    "text": ("text_delta", "citations_delta"),
    "tool_use": ("input_json_delta",),
    "server_tool_use": ("input_json_delta",),
}


def check_message(m: Any, where: str) -> None:
    expect(isinstance(m, dict), f"{where}: not a JSON object")
    expect(str(m.get("id", "")).startswith("msg_"), f"{where}: id {m.get('id')!r} does not start with msg_")
    expect((m.get("type"), m.get("role")) == ("message", "assistant"), f"{where}: not a message from the assistant")
    expect(isinstance(m.get("model"), str) and bool(m["model"]), f"{where}: no model")
    content = m.get("content")
    # Empty content is Anthropic's too: an answer cut before its first block, or none at all.
    expect(isinstance(content, list), f"{where}: content is not a list of blocks")
    for n, block in enumerate(content):
        check_block(block, f"{where}: content[{n}]")
    kinds = [b["type"] for b in content]
    first_other = next((n for n, k in enumerate(kinds) if k not in REASONING), len(kinds))
    expect(all(k not in REASONING for k in kinds[first_other:]), f"{where}: thinking after the answer: {kinds}")
    reason = m.get("stop_reason")
    expect(reason in STOP_REASONS, f"{where}: stop_reason {reason!r}")
    expect((reason == "tool_use") == ("tool_use" in kinds), f"{where}: stop_reason {reason!r} with blocks {kinds}")
    sequence = m.get("stop_sequence")
    expected = isinstance(sequence, str) if reason == "stop_sequence" else sequence is None
    expect(expected, f"{where}: stop_sequence {sequence!r} with stop_reason {reason!r}")
    check_usage(m.get("usage"), where)


def check_block(b: Any, where: str) -> None:
    expect(isinstance(b, dict) and b.get("type") in BLOCKS, f"{where}: not a content block: {str(b)[:80]}")
    kind = b["type"]
    if kind == "thinking":
        expect(isinstance(b.get("thinking"), str), f"{where}: thinking is not a string")
        expect(isinstance(b.get("signature"), str) and bool(b["signature"]), f"{where}: thinking without a signature")
    elif kind == "text":
        expect(isinstance(b.get("text"), str), f"{where}: text is not a string")
    elif kind in ("tool_use", "server_tool_use"):
        expect(isinstance(b.get("id"), str) and bool(b["id"]), f"{where}: {kind} without an id")
        expect(isinstance(b.get("name"), str) and bool(b["name"]), f"{where}: {kind} without a name")
        expect(isinstance(b.get("input"), dict), f"{where}: {kind} input is not an object: {b.get('input')!r}")


def check_usage(u: Any, where: str) -> None:
    expect(isinstance(u, dict), f"{where}: no usage")
    for name in COUNTS:
        value = u.get(name)
        expect(isinstance(value, int) and value >= 0, f"{where}: usage.{name} is {value!r}")
    split = u.get("cache_creation")
    expect(isinstance(split, dict), f"{where}: usage.cache_creation (the 5m/1h split) is missing")
    five, hour = split.get("ephemeral_5m_input_tokens"), split.get("ephemeral_1h_input_tokens")
    expect(isinstance(five, int) and isinstance(hour, int), f"{where}: cache_creation lacks its 5m/1h counts")
    written = u["cache_creation_input_tokens"]
    expect(five + hour == written, f"{where}: cache_creation 5m {five} + 1h {hour} != {written} written")


def billed_input(u: dict[str, Any]) -> int:
    """The whole prompt as billed: uncached, read from the cache and written to it."""
    return int(u["input_tokens"]) + int(u["cache_read_input_tokens"]) + int(u["cache_creation_input_tokens"])


def signed_thinking(m: dict[str, Any]) -> dict[str, Any] | None:
    return next((b for b in m["content"] if b.get("type") == "thinking"), None)


class Rebuilt:
    """The message as the events build it; each event must come where Anthropic sends it."""

    def __init__(self) -> None:
        self.message: dict[str, Any] | None = None
        self.open: dict[str, Any] | None = None  # the block streaming now
        self.arguments = ""  # a tool_use block's input_json_delta parts
        self.delta_seen = False
        self.stopped = False

    def add(self, name: str | None, e: dict[str, Any]) -> None:
        kind = e.get("type")
        expect(name == kind, f"an event named {name!r} carries type {kind!r}")
        if kind == "ping":
            return
        if kind == "error":
            raise Failed(f"the stream ended in an error event: {str(e.get('error'))[:120]}")
        expect(not self.stopped, f"{kind} after message_stop")
        if kind == "message_start":
            self._start(e)
            return
        expect(self.message is not None, f"{kind} before message_start")
        step = {
            "content_block_start": self._block_start,
            "content_block_delta": self._block_delta,
            "content_block_stop": self._block_stop,
            "message_delta": self._message_delta,
            "message_stop": self._message_stop,
        }.get(str(kind))
        if step is None:
            raise Failed(f"event {kind!r} is not one of the Messages stream's")
        step(e)

    def _start(self, e: dict[str, Any]) -> None:
        expect(self.message is None, "a second message_start")
        m = e.get("message")
        expect(isinstance(m, dict), "message_start carries no message")
        assert isinstance(m, dict)
        expect(m.get("content") == [], "message_start's message is not empty")
        expect(m.get("stop_reason") is None, "message_start already has a stop_reason")
        self.message = {**m, "content": []}

    def _block_start(self, e: dict[str, Any]) -> None:
        assert self.message is not None
        content = self.message["content"]
        expect(self.open is None, "a block started before the last one stopped")
        expect(not self.delta_seen, "a block started after message_delta")
        expect(e.get("index") == len(content), f"content_block_start index {e.get('index')}, expected {len(content)}")
        block = e.get("content_block")
        expect(isinstance(block, dict) and block.get("type") in BLOCKS, f"a block that is not one: {str(block)[:80]}")
        assert isinstance(block, dict)
        self.open, self.arguments = dict(block), ""
        content.append(self.open)

    def _block_delta(self, e: dict[str, Any]) -> None:
        block = self.open
        expect(block is not None, "a content_block_delta outside any block")
        assert block is not None and self.message is not None
        expect(e.get("index") == len(self.message["content"]) - 1, "a delta for a block that is not open")
        delta = e.get("delta") or {}
        kind = str(delta.get("type"))
        expect(kind in DELTAS.get(block["type"], ()), f"a {kind} in a {block['type']} block")
        if kind == "input_json_delta":
            self.arguments += str(delta.get("partial_json", ""))
        elif kind != "citations_delta":
            field = kind.removesuffix("_delta")
            block[field] = str(block.get(field) or "") + str(delta.get(field, ""))

    def _block_stop(self, e: dict[str, Any]) -> None:
        block = self.open
        expect(block is not None, "a content_block_stop outside any block")
        assert block is not None and self.message is not None
        expect(e.get("index") == len(self.message["content"]) - 1, "content_block_stop for a block not open")
        if block["type"] in ("tool_use", "server_tool_use") and self.arguments:
            try:
                block["input"] = json.loads(self.arguments)
            except ValueError:
                raise Failed(f"a tool_use input that is not JSON: {self.arguments[:60]!r}") from None
        self.open = None

    def _message_delta(self, e: dict[str, Any]) -> None:
        assert self.message is not None
        expect(self.open is None, "message_delta while a block is open")
        expect(not self.delta_seen, "a second message_delta")
        delta, usage = e.get("delta") or {}, e.get("usage")
        expect(delta.get("stop_reason") is not None, "message_delta without a stop_reason")
        expect(isinstance(usage, dict) and "output_tokens" in usage, "message_delta without usage.output_tokens")
        assert isinstance(usage, dict)
        self.message.update(stop_reason=delta["stop_reason"], stop_sequence=delta.get("stop_sequence"))
        self.message["usage"] = {**(self.message.get("usage") or {}), **usage}
        self.delta_seen = True

    def _message_stop(self, e: dict[str, Any]) -> None:
        expect(self.delta_seen, "message_stop without a message_delta before it")
        self.stopped = True


def rebuild(events: list[Event]) -> dict[str, Any]:
    """The message the events build, failing at the first one out of place."""
    rebuilt = Rebuilt()
    for name, data in events:
        rebuilt.add(name, data)
    expect(rebuilt.stopped, "the stream did not end with message_stop")
    assert rebuilt.message is not None
    return rebuilt.message
