"""Closing a structured answer or a call's arguments that the output cap cut mid-value, for
every engine: the text that, appended as the answer's last delta, makes the value whole and
valid under its schema (parsers/json_closing.py). The answer still ends with
``finish_reason: "length"``; the closing is the server's text, not the model's, and is not
counted in ``completion_tokens``.

``UpstreamCloser`` does it for an upstream's answer, which no grammar of this server bound: it
closes only what is already the start of a JSON value, and leaves anything else as it came.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from typing import Any

from kimi_server.engines.types import (
    ContentDelta,
    EngineEvent,
    Finish,
    GenerationRequest,
    ToolCallDelta,
    ToolSpec,
)
from kimi_server.parsers.json_closing import close_json

NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


def structured_schema(request: GenerationRequest) -> dict[str, Any] | None:
    """The schema a text answer is closed under; None: free text, never closed."""
    fmt = request.output_format
    if fmt.kind == "json_schema" and fmt.schema is not None:
        return fmt.schema
    return {"type": "object"} if fmt.kind in ("json_object", "json_schema") else None


def close_answer(said: str, request: GenerationRequest, schema: dict[str, Any]) -> str:
    """What closes a structured answer that has said ``said``. Under Partial Mode the value
    began with the client's prefix, which the answer does not repeat."""
    prefix = request.answer_prefix
    lead = prefix.text if prefix is not None else ""
    return close_json(lead + said, schema) or ""


def arguments_end(arguments: str, schema: dict[str, Any]) -> str:
    """The rest of a call's arguments object, given its text so far (perhaps none)."""
    if not arguments.strip():
        return "{" + (close_json("{", schema) or "}")
    return close_json(arguments, schema) or ""


def tool_parameters(tools: Sequence[ToolSpec], name: str) -> dict[str, Any]:
    """The parameters a call of ``name`` is closed under (none known: any object)."""
    found = next((t for t in tools if t.name == name and t.kind != "custom"), None)
    return (found.parameters if found is not None else None) or NO_PARAMETERS


class UpstreamCloser:
    """Watches an upstream answer's events; at a ``length`` finish, gives the deltas that close
    what was cut: the last call's arguments, or else the structured answer."""

    def __init__(self, request: GenerationRequest) -> None:
        self._request = request
        self._schema = structured_schema(request)
        self._answer: list[str] = []
        # The last call begun: its index, name and kind (its first delta carries them), and
        # its arguments so far.
        self._call: tuple[int, str, str] | None = None
        self._arguments: list[str] = []

    @classmethod
    def for_request(cls, request: GenerationRequest) -> UpstreamCloser | None:
        """None where nothing can need closing (free text, no tools): the relay's common path
        pays nothing."""
        if structured_schema(request) is None and not request.tools:
            return None
        return cls(request)

    def add(self, event: EngineEvent) -> None:
        if isinstance(event, ContentDelta):
            if self._schema is not None:
                self._answer.append(event.text)
        elif isinstance(event, ToolCallDelta):
            if self._call is None or self._call[0] != event.index:
                self._call, self._arguments = (event.index, event.name or "", event.kind), []
            self._arguments.append(event.arguments)

    def closing(self, finish: Finish) -> list[EngineEvent]:
        if finish.reason != "length":
            return []
        if self._call is not None:
            index, name, kind = self._call
            arguments = "".join(self._arguments)
            if kind != "function" or not arguments.strip():
                return []  # a custom tool's input is free text; no arguments yet: nothing to close
            end = arguments_end(arguments, tool_parameters(self._request.tools, name))
            return [ToolCallDelta(index, arguments=end)] if end else []
        if self._schema is None:
            return []
        said = "".join(self._answer)
        if not said.strip() and self._request.answer_prefix is None:
            return []  # the cap ended the reasoning: there is no answer to close
        end = close_answer(said, self._request, self._schema)
        return [ContentDelta(end)] if end else []


async def closed_when_cut(
    events: AsyncGenerator[EngineEvent, None], closer: UpstreamCloser
) -> AsyncGenerator[EngineEvent, None]:
    """The events, with the closing of what the cap cut just before a ``length`` finish."""
    async with aclosing(events) as stream:
        async for event in stream:
            if isinstance(event, Finish):
                for closing in closer.closing(event):
                    yield closing
            else:
                closer.add(event)
            yield event
