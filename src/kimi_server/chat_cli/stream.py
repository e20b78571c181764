"""One turn against the API, through the openai SDK: either endpoint's stream turned into the
same few events (reasoning text, answer text, the end with its reasoning token count)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import openai

from kimi_server.chat_cli.session import Session

# Where servers put streamed reasoning in a chat delta: Moonshot and this server use
# reasoning_content, recent vLLM releases use reasoning. A server with neither just answers.
CHAT_REASONING_FIELDS = ("reasoning_content", "reasoning")
# Responses: the full reasoning text where a server streams it, else the summary this server sends.
REASONING_TEXT = "response.reasoning_text.delta"
REASONING_SUMMARY = "response.reasoning_summary_text.delta"


@dataclass(frozen=True)
class Piece:
    kind: Literal["reasoning", "answer"]
    text: str


@dataclass(frozen=True)
class Done:
    reasoning_tokens: int | None  # None: the server reported no count


class StreamFailed(Exception):
    """The server ended a stream with an error event."""


def turn(client: openai.OpenAI, session: Session, prompt: str) -> Iterator[Piece | Done]:
    if session.endpoint == "responses":
        return _responses_turn(client, session, prompt)
    return _chat_turn(client, session, prompt)


def _chat_turn(client: openai.OpenAI, session: Session, prompt: str) -> Iterator[Piece | Done]:
    # The effort goes as a plain field: the SDK's type knows only OpenAI's level names.
    extra: dict[str, Any] = {"reasoning_effort": session.effort} if session.effort else {}
    if session.max_tokens is not None:
        extra["max_tokens"] = session.max_tokens
    messages: Any = session.chat_messages(prompt)  # plain dicts, as the SDK sends them
    stream = client.chat.completions.create(
        model=session.model,
        messages=messages,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=extra or None,
    )
    reasoning_tokens: int | None = None
    with stream:
        for chunk in stream:
            for choice in chunk.choices:
                fields = choice.delta.model_extra or {}
                for name in CHAT_REASONING_FIELDS:
                    if isinstance(fields.get(name), str) and fields[name]:
                        yield Piece("reasoning", fields[name])
                        break
                if choice.delta.content:
                    yield Piece("answer", choice.delta.content)
            details = chunk.usage.completion_tokens_details if chunk.usage else None
            if details is not None and details.reasoning_tokens is not None:
                reasoning_tokens = details.reasoning_tokens
    yield Done(reasoning_tokens)


def _responses_extra(session: Session) -> dict[str, Any]:
    """The request's fields beyond model and input, sent as plain body fields."""
    reasoning: dict[str, Any] = {"summary": "detailed"}
    if session.effort:
        reasoning["effort"] = session.effort
    extra: dict[str, Any] = {"reasoning": reasoning}
    if session.max_tokens is not None:
        extra["max_output_tokens"] = session.max_tokens
    if session.system:
        extra["instructions"] = session.system
    return extra


def _responses_turn(client: openai.OpenAI, session: Session, prompt: str) -> Iterator[Piece | Done]:
    items: Any = session.response_input(prompt)
    stream = client.responses.create(
        model=session.model,
        input=items,
        stream=True,
        extra_body=_responses_extra(session),
    )
    reasoning_tokens: int | None = None
    full_text = False  # once the full reasoning streams, its summary would repeat it
    with stream:
        for event in stream:
            kind = event.type
            delta = getattr(event, "delta", None)
            if kind == REASONING_TEXT and isinstance(delta, str):
                full_text = True
                yield Piece("reasoning", delta)
            elif kind == REASONING_SUMMARY and isinstance(delta, str) and not full_text:
                yield Piece("reasoning", delta)
            elif kind == "response.output_text.delta" and isinstance(delta, str):
                yield Piece("answer", delta)
            elif kind == "response.completed":
                usage = getattr(getattr(event, "response", None), "usage", None)
                if usage is not None:
                    reasoning_tokens = usage.output_tokens_details.reasoning_tokens
            elif kind in ("response.failed", "error"):
                raise StreamFailed(_failure_message(event))
    yield Done(reasoning_tokens)


def _failure_message(event: Any) -> str:
    error = getattr(getattr(event, "response", None), "error", None) or event
    return str(getattr(error, "message", None) or "the server ended the stream with an error")
