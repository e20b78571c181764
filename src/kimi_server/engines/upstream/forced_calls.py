"""``tool_choice`` "required" or a named function on an upstream that does not constrain tool
calls itself: the upstream is asked for a JSON answer under a schema that only a call can
satisfy, ``{"name": <one of the tools>, "arguments": <that tool's parameters>}``, and that
answer is turned back into a tool call here, streamed as it arrives.

Whether an upstream constrains calls natively is the dialect's ``forced_tool_calls``, which a
route may override (``capabilities.forced_tool_calls``); one that can do neither gets a 400.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import replace
from typing import Any, Literal

from kimi_server.engines.types import ContentDelta, EngineEvent, Finish, GenerationRequest, ToolCallDelta, ToolSpec
from kimi_server.engines.upstream.dialects import Dialect
from kimi_server.engines.upstream.required_calls import missing_call
from kimi_server.engines.web_search_tool import WEB_SEARCH_NAME
from kimi_server.errors import InvalidRequestError
from kimi_server.settings import UpstreamCapabilities

ForcedMode = Literal["native", "json_schema", "none"]
EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


def kept_by(dialect: Dialect, caps: UpstreamCapabilities) -> ForcedMode:
    """How an upstream keeps a forced call: its route's setting, else its dialect's."""
    mode: ForcedMode = caps.forced_tool_calls or dialect.forced_tool_calls
    if mode == "json_schema" and not caps.json_schema:
        return "none"
    return mode


def forced_mode(req: GenerationRequest, dialect: Dialect, caps: UpstreamCapabilities) -> ForcedMode | None:
    """How this upstream keeps a forced call; None when the request forces none."""
    if not req.tools or req.tool_choice.mode not in ("required", "named"):
        return None
    return kept_by(dialect, caps)


def check_forced(req: GenerationRequest, dialect: Dialect, caps: UpstreamCapabilities) -> None:
    if forced_mode(req, dialect, caps) == "none":
        raise InvalidRequestError(
            f"{req.model} is served by an upstream engine that can neither constrain tool calls "
            "nor JSON output, so a call cannot be guaranteed; send 'tool_choice' \"auto\" (or "
            "leave it out).",
            param="tool_choice",
            code="unsupported_parameter",
        )


def call_schema(tools: tuple[ToolSpec, ...], name: str | None) -> dict[str, Any]:
    """A JSON Schema only a call satisfies: of the function ``name``, else of any of ``tools``."""
    chosen = [t for t in tools if t.kind != "custom" and (name is None or t.name == name)]
    params = [t.parameters or EMPTY_PARAMETERS for t in chosen]
    # A tool's own "$ref"s point into its parameters: each set of parameters moves whole
    # into "$defs" and its pointers are rewritten, so they resolve under the new root.
    refs = any('"$ref"' in json.dumps(p) for p in params)
    defs: dict[str, Any] = {}
    options: list[dict[str, Any]] = []
    for i, (tool, schema) in enumerate(zip(chosen, params, strict=True)):
        if refs:
            defs[f"tool{i}"] = _rebase(schema, f"#/$defs/tool{i}")
            schema = {"$ref": f"#/$defs/tool{i}"}
        options.append(
            {
                "type": "object",
                "properties": {"name": {"type": "string", "const": tool.name}, "arguments": schema},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    out: dict[str, Any] = options[0] if len(options) == 1 else {"anyOf": options}
    return {**out, "$defs": defs} if defs else out


def _rebase(node: Any, base: str) -> Any:
    if isinstance(node, dict):
        return {
            k: base + v[1:] if k == "$ref" and isinstance(v, str) and v.startswith("#") else _rebase(v, base)
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_rebase(v, base) for v in node]
    return node


def json_answer_fields(req: GenerationRequest) -> dict[str, Any]:
    """Body fields of the JSON-constrained request: the tools stay visible to the model (its
    template shows them) but the upstream is told not to call them itself."""
    name = req.tool_choice.name if req.tool_choice.mode == "named" else None
    return {
        "tool_choice": "none",
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "tool_call", "schema": call_schema(req.tools, name), "strict": True},
        },
    }


class CallReader:
    """Turns the streamed JSON ``{"name": …, "arguments": {…}}`` into tool-call deltas: the
    call starts once its name is read, then its arguments stream as their text arrives."""

    def __init__(self) -> None:
        self.id = f"call_{secrets.token_hex(12)}"
        self.name: str | None = None
        self._buf = ""
        self._i = 0  # the character being read
        self._depth = 0
        self._in_str = self._escaped = False
        self._expect = "key"  # at the top level: a key, its colon, its value
        self._key: str | None = None
        self._start = 0  # where the top-level string being read began
        self._args: tuple[int, int | None] | None = None  # the arguments' text span
        self._sent = -1  # arguments characters emitted; -1: the call has not started
        self.done = False
        self.native = False  # the upstream made the call itself

    def feed(self, text: str) -> list[EngineEvent]:
        start = len(self._buf)
        self._buf += text
        for i in range(start, len(self._buf)):
            if self.done:
                break
            self._i = i
            self._step(self._buf[i])
        return self._emit()

    def _step(self, c: str) -> None:
        if self._in_str:
            self._string_char(c)
        else:
            self._structure_char(c)

    def _string_char(self, c: str) -> None:
        """Inside a string only its end matters; a top-level one is read whole once it ends."""
        if self._escaped:
            self._escaped = False
        elif c == "\\":
            self._escaped = True
        elif c == '"':
            self._in_str = False
            if self._depth == 1:
                self._top_string(json.loads(self._buf[self._start : self._i + 1]))

    def _structure_char(self, c: str) -> None:
        if c == '"':
            self._in_str = True
            self._start = self._i
            self._value_starts()
        elif c in "{[":
            self._depth += 1
            if self._depth == 2:
                self._value_starts()
        elif c in "}]":
            self._close()
        elif self._depth == 1 and c == ":":
            self._expect = "value"
        elif self._depth == 1 and c == ",":
            self._expect, self._key = "key", None

    def _close(self) -> None:
        """A container ends: back at the top level, an arguments object or array ends with it."""
        self._depth -= 1
        if self._depth == 1 and self._args is not None and self._args[1] is None:
            self._args = (self._args[0], self._i + 1)
        self.done = self._depth == 0

    def _value_starts(self) -> None:
        if self._expect == "value" and self._key == "arguments" and self._args is None:
            self._args = (self._i, None)

    def _top_string(self, value: Any) -> None:
        if self._expect == "key":
            self._key, self._expect = str(value), "colon"
        elif self._expect == "value":
            if self._key == "name" and self.name is None:
                self.name = str(value)
            elif self._key == "arguments" and self._args is not None and self._args[1] is None:
                self._args = (self._args[0], self._i + 1)  # a string as arguments: kept as is
            self._expect = "after"

    def _emit(self) -> list[EngineEvent]:
        if self.name is None:
            return []
        text = ""
        if self._args is not None:
            start, end = self._args
            text = self._buf[start : end if end is not None else len(self._buf)]
        if self._sent < 0:
            self._sent = len(text)
            call = ToolCallDelta(0, self.id, self.name, text)
            # $web_search comes back as the built-in call the server answers itself.
            return [replace(call, kind="builtin_function") if self.name == WEB_SEARCH_NAME else call]
        piece, self._sent = text[self._sent :], len(text)
        return [ToolCallDelta(0, arguments=piece)] if piece else []

    def finish(self, finish: Finish) -> Finish:
        if self.native or (self.done and self.name is not None and self._args is not None):
            return finish if finish.reason == "length" else Finish("tool_calls", finish.usage)
        if finish.reason == "length":
            return finish  # cut at the output cap mid-call: the client sees what there was
        raise missing_call()


async def as_calls(events: AsyncGenerator[EngineEvent, None], reader: CallReader) -> AsyncGenerator[EngineEvent, None]:
    """An attempt's events with its JSON answer read as the call."""
    async with aclosing(events) as inner:
        async for event in inner:
            if isinstance(event, ContentDelta) and not reader.native:
                for out in reader.feed(event.text):
                    yield out
            elif isinstance(event, Finish):
                yield reader.finish(event)
            else:
                if isinstance(event, ToolCallDelta) and reader.name is None:
                    reader.native = True
                yield event
