"""Partial Mode through an upstream: the prefix as the dialect carries it natively, and the
answer without the prefix, whether or not the upstream repeats it.

Moonshot's API takes ``partial: true`` on the last assistant message; vLLM continues the last
message with ``continue_final_message`` (and no generation prompt); llama.cpp's server continues
a conversation that ends in an assistant message. Any other dialect has no such switch: the
request is refused before anything is sent.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

from kimi_server.engines.types import AnswerPrefix, ContentDelta, EngineEvent, GenerationRequest, ReasoningDelta
from kimi_server.engines.upstream.dialects import Dialect
from kimi_server.errors import InvalidRequestError


def check_partial(req: GenerationRequest, dialect: Dialect) -> None:
    prefix = req.answer_prefix
    if prefix is not None and dialect.partial == "none":
        raise InvalidRequestError(
            f"'{prefix.param}': {req.model} is served by an upstream engine without Partial Mode "
            f"(its '{dialect.name}' dialect cannot continue a prefix); send the request without 'partial'.",
            param=prefix.param,
            code="unsupported_parameter",
        )
    if prefix is not None and dialect.partial != "flag" and req.output_format.kind != "text" and prefix.text.strip():
        # vLLM's and llama.cpp's grammars start afresh at the first generated token: the answer
        # would be a whole value of its own after the prefix, never its continuation.
        raise InvalidRequestError(
            f"'{prefix.param}': {req.model} is served by an upstream engine whose JSON output "
            "cannot continue a prefix; send the prefix without a JSON response format.",
            param=prefix.param,
            code="unsupported_parameter",
        )


def prefix_message(prefix: AnswerPrefix, dialect: Dialect) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "assistant", "content": prefix.text}
    if prefix.name is not None:
        out["name"] = prefix.name
    if dialect.partial == "flag":
        out["partial"] = True
    return out


def prefix_fields(dialect: Dialect) -> dict[str, Any]:
    if dialect.partial == "continue":
        return {"continue_final_message": True, "add_generation_prompt": False}
    return {}


async def without_echo(events: AsyncGenerator[EngineEvent, None], prefix: str) -> AsyncGenerator[EngineEvent, None]:
    """The events with the prefix dropped where the answer's text starts with it: content is
    held only while it may still be the prefix repeated."""
    held = ""
    deciding = bool(prefix)
    async with aclosing(events) as stream:
        async for event in stream:
            if not deciding:
                yield event
                continue
            if isinstance(event, ContentDelta):
                held += event.text
                if len(held) < len(prefix) and prefix.startswith(held):
                    continue
                deciding = False
                text = held[len(prefix) :] if held.startswith(prefix) else held
                if text:
                    yield ContentDelta(text)
                continue
            if not isinstance(event, ReasoningDelta):
                # Anything but reasoning ends the text: what was held is the answer's own.
                deciding = False
                if held:
                    yield ContentDelta(held)
            yield event
