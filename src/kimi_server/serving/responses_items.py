"""The output items of a Responses answer and their events: the reasoning item (its summary
streamed, its text sealed), the message, and the tool calls, each opened, added to and closed
with strictly increasing ``sequence_number``s. ``responses.py`` drives them from the engine's
events."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kimi_server.engines.types import ToolCallDelta
from kimi_server.serving.common import new_id
from kimi_server.serving.responses_request import ResponsesPlan, WireName
from kimi_server.serving.sealing import Sealer
from kimi_server.serving.summary import Summarizer

Event = dict[str, Any]


@dataclass
class _Reasoning:
    index: int
    summarizer: Summarizer
    id: str = field(default_factory=lambda: new_id("rs_"))
    part_open: bool = False
    done: bool = False


@dataclass
class _Message:
    index: int
    id: str = field(default_factory=lambda: new_id("msg_"))
    text: str = ""


@dataclass
class _Call:
    index: int
    call_id: str
    wire: WireName
    custom: bool
    id: str = field(default_factory=lambda: new_id("fc_"))
    arguments: str = ""

    def item(self, status: str) -> dict[str, Any]:
        if self.custom:
            return {
                "type": "custom_tool_call",
                "id": self.id,
                "call_id": self.call_id,
                "name": self.wire.name,
                "input": self.arguments,
            }
        item = {
            "type": "function_call",
            "id": self.id,
            "call_id": self.call_id,
            "name": self.wire.name,
            "arguments": self.arguments,
            "status": status,
        }
        if self.wire.namespace:
            item["namespace"] = self.wire.namespace
        return item


class OutputItems:
    def __init__(self, plan: ResponsesPlan, sealer: Sealer) -> None:
        self.plan = plan
        self.sealer = sealer
        self.seq = 0
        self.items: dict[int, dict[str, Any]] = {}  # finished output items by output_index
        self.next_index = 0
        self.reasoning: _Reasoning | None = None
        self.message: _Message | None = None
        self.calls: dict[int, _Call] = {}

    def _event(self, kind: str, **fields: Any) -> Event:
        event = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return event

    def _take_index(self) -> int:
        self.next_index += 1
        return self.next_index - 1

    def _open_reasoning(self) -> list[Event]:
        if not self.plan.gen.reasoning:
            return []  # switched off by the client's ``thinking``: no reasoning item at all
        self.reasoning = _Reasoning(self._take_index(), Summarizer(self.plan.summary_chars))
        item = {
            "type": "reasoning",
            "id": self.reasoning.id,
            "summary": [],
            "status": "in_progress",
        }
        return [self._event("response.output_item.added", output_index=self.reasoning.index, item=item)]

    def _summary_piece(self, r: _Reasoning, piece: str) -> list[Event]:
        out: list[Event] = []
        if not piece:
            return out
        ids = {"item_id": r.id, "output_index": r.index, "summary_index": 0}
        if not r.part_open:
            r.part_open = True
            part = {"type": "summary_text", "text": ""}
            out.append(self._event("response.reasoning_summary_part.added", **ids, part=part))
        out.append(self._event("response.reasoning_summary_text.delta", **ids, delta=piece))
        return out

    def _reasoning_delta(self, text: str) -> list[Event]:
        r = self.reasoning
        if r is None or r.done:
            return []  # engines reason before they answer; late reasoning has no item to join
        return self._summary_piece(r, r.summarizer.feed(text))

    def _close_reasoning(self, status: str) -> list[Event]:
        r = self.reasoning
        if r is None or r.done:
            return []
        r.done = True
        out = self._summary_piece(r, r.summarizer.finish())
        summary = r.summarizer.summary
        parts = []
        if r.part_open:
            ids = {"item_id": r.id, "output_index": r.index, "summary_index": 0}
            part = {"type": "summary_text", "text": summary}
            out.append(self._event("response.reasoning_summary_text.done", **ids, text=summary))
            out.append(self._event("response.reasoning_summary_part.done", **ids, part=part))
            parts.append(part)
        sealed = self.sealer.seal(r.summarizer.text, key_id=self.plan.key_id)
        item = {
            "type": "reasoning",
            "id": r.id,
            "summary": parts,
            "encrypted_content": sealed,
            "status": status,
        }
        return [*out, self._done(r.index, item)]

    def _done(self, index: int, item: dict[str, Any]) -> Event:
        self.items[index] = item
        return self._event("response.output_item.done", output_index=index, item=item)

    def _content_delta(self, text: str) -> list[Event]:
        out = self._close_reasoning("completed")
        out += self._open_message()
        m = self.message
        assert m is not None
        if text:
            m.text += text
            out.append(
                self._event(
                    "response.output_text.delta",
                    item_id=m.id,
                    output_index=m.index,
                    content_index=0,
                    delta=text,
                    logprobs=[],
                )
            )
        return out

    def _open_message(self) -> list[Event]:
        if self.message is not None:
            return []
        m = self.message = _Message(self._take_index())
        item = {
            "type": "message",
            "id": m.id,
            "status": "in_progress",
            "role": "assistant",
            "content": [],
        }
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        ids = {"item_id": m.id, "output_index": m.index, "content_index": 0}
        return [
            self._event("response.output_item.added", output_index=m.index, item=item),
            self._event("response.content_part.added", **ids, part=part),
        ]

    def _close_message(self, status: str) -> list[Event]:
        m = self.message
        if m is None or m.index in self.items:
            return []
        ids = {"item_id": m.id, "output_index": m.index, "content_index": 0}
        part = {"type": "output_text", "text": m.text, "annotations": [], "logprobs": []}
        item = {
            "type": "message",
            "id": m.id,
            "status": status,
            "role": "assistant",
            "content": [part],
        }
        return [
            self._event("response.output_text.done", **ids, text=m.text, logprobs=[]),
            self._event("response.content_part.done", **ids, part=part),
            self._done(m.index, item),
        ]

    def _call_delta(self, delta: ToolCallDelta) -> list[Event]:
        out = self._close_reasoning("completed")
        call = self.calls.get(delta.index)
        if call is None:
            flat = delta.name or ""
            call = _Call(
                self._take_index(),
                delta.id or new_id("call_"),
                self.plan.names.get(flat, WireName(flat)),
                delta.kind == "custom",
            )
            if call.custom:
                call.id = new_id("ctc_")
            self.calls[delta.index] = call
            item = call.item("in_progress")
            out.append(self._event("response.output_item.added", output_index=call.index, item=item))
        if delta.arguments:
            call.arguments += delta.arguments
            kind = "response.custom_tool_call_input.delta" if call.custom else "response.function_call_arguments.delta"
            out.append(self._event(kind, item_id=call.id, output_index=call.index, delta=delta.arguments))
        return out

    def _close_calls(self, status: str) -> list[Event]:
        out: list[Event] = []
        for call in self.calls.values():
            if call.index in self.items:
                continue
            if call.custom:
                out.append(
                    self._event(
                        "response.custom_tool_call_input.done",
                        item_id=call.id,
                        output_index=call.index,
                        input=call.arguments,
                    )
                )
            else:
                out.append(
                    self._event(
                        "response.function_call_arguments.done",
                        item_id=call.id,
                        output_index=call.index,
                        name=call.wire.name,
                        arguments=call.arguments,
                    )
                )
            out.append(self._done(call.index, call.item(status)))
        return out

    def _close_all(self, status: str) -> list[Event]:
        return [
            *self._close_reasoning(status),
            *self._close_message(status),
            *self._close_calls(status),
        ]
