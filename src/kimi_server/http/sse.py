"""Server-sent events framing. Each event is encoded whole and handed over as one write."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

from kimi_server.engines.base import AsyncStream
from kimi_server.engines.types import ContentDelta, EngineEvent, ReasoningDelta
from kimi_server.errors import APIError, InternalServerError
from kimi_server.logsafe import log_failure
from kimi_server.serving.chat import ChunkBuilder
from kimi_server.serving.messages_errors import anthropic_error

log = logging.getLogger(__name__)

DONE = b"data: [DONE]\n\n"


# One encoder for every frame: json.dumps with options builds a new one per call.
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def _dumps(obj: Any) -> str:
    return _ENCODER.encode(obj)


def data_frame(obj: Any) -> bytes:
    return f"data: {_dumps(obj)}\n\n".encode()


def event_frame(event_type: str, obj: Any) -> bytes:
    return f"event: {event_type}\ndata: {_dumps(obj)}\n\n".encode()


def failure_body(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, APIError):
        return exc.to_body()
    log_failure(log, "stream failed", exc)
    return InternalServerError().to_body()


_CHUNK_KEYS = ("id", "object", "created", "model", "choices")
_CHUNK_KEYS_USAGE = (*_CHUNK_KEYS, "usage")
_CHOICE_KEYS = ("index", "delta", "finish_reason", "logprobs")


class ChunkFramer:
    """``data_frame`` for a stream's chunks, byte for byte, at a fraction of the cost.

    Within one stream the chunks differ only in their one choice's ``delta`` and
    ``finish_reason``: the rest is encoded once, and each chunk encodes just those two. A chunk
    of any other shape (the usage chunk, an error) is framed whole.
    """

    def __init__(self) -> None:
        self._envelope: tuple[Any, ...] | None = None
        self._head = b""
        self._tail = b""

    def frame(self, chunk: dict[str, Any]) -> bytes:
        choices = chunk.get("choices")
        if type(choices) is not list or len(choices) != 1:
            return data_frame(chunk)
        choice = choices[0]
        keys = tuple(chunk)
        if (
            type(choice) is not dict
            or tuple(choice) != _CHOICE_KEYS
            or choice["index"] != 0
            or choice["logprobs"] is not None
            or (keys != _CHUNK_KEYS and (keys != _CHUNK_KEYS_USAGE or chunk["usage"] is not None))
        ):
            return data_frame(chunk)
        envelope = (chunk["id"], chunk["object"], chunk["created"], chunk["model"], len(keys))
        if envelope != self._envelope:
            self._envelope = envelope
            head = _dumps({key: chunk[key] for key in _CHUNK_KEYS[:4]})[:-1]
            self._head = f'data: {head},"choices":[{{"index":0,"delta":'.encode()
            self._tail = (',"logprobs":null}]' + (',"usage":null' if len(keys) == 6 else "") + "}\n\n").encode()
        finish = choice["finish_reason"]
        return b"".join(
            (
                self._head,
                _dumps(choice["delta"]).encode(),
                b',"finish_reason":',
                b"null" if finish is None else _dumps(finish).encode(),
                self._tail,
            )
        )

    def text(self, field: bytes, text: str) -> bytes:
        """The frame of ``{field: text}`` with no finish reason, for a stream whose envelope a
        ``frame`` call has already seen: the frame ``frame`` would build, byte for byte."""
        return b"".join((self._head, b'{"', field, b'":', _dumps(text).encode(), b'},"finish_reason":null', self._tail))


async def chat_event_sse(
    events: AsyncStream[EngineEvent], model: str, *, include_usage: bool
) -> AsyncGenerator[bytes, None]:
    """``chat_sse(stream_chunks(events, ...))`` in one generator, byte for byte: one generator
    layer per event instead of two, and the text and reasoning deltas (nearly every event of a
    stream) framed without building their chunk objects."""
    framer = ChunkFramer()
    builder = ChunkBuilder(model, include_usage=include_usage)
    async with aclosing(events):
        try:
            yield framer.frame(builder.first())  # the envelope the text frames reuse
            async for event in events:
                if type(event) is ContentDelta:
                    yield framer.text(b"content", event.text)
                elif type(event) is ReasoningDelta:
                    yield framer.text(b"reasoning_content", event.text)
                else:
                    for chunk in builder.chunks(event):
                        yield framer.frame(chunk)
        except Exception as exc:
            yield data_frame(failure_body(exc))
    yield DONE


async def chat_sse(chunks: AsyncStream[dict[str, Any]]) -> AsyncGenerator[bytes, None]:
    """Chat Completions framing: ``data:`` lines, an error event on failure, always ``[DONE]``."""
    framer = ChunkFramer()
    async with aclosing(chunks):
        try:
            async for chunk in chunks:
                yield framer.frame(chunk)
        except Exception as exc:
            yield data_frame(failure_body(exc))
    yield DONE


_TEXT_FIELDS = {"text_delta": "text", "thinking_delta": "thinking"}


class MessagesFramer:
    """``event_frame`` for a Messages stream's events, byte for byte; its text and thinking
    deltas (nearly every event of a stream) from a template per block, encoding just the text."""

    def __init__(self) -> None:
        self._heads: dict[tuple[int, str], bytes] = {}

    def frame(self, name: str, data: dict[str, Any]) -> bytes:
        if name == "content_block_delta":
            delta = data["delta"]
            field = _TEXT_FIELDS.get(delta.get("type", ""))
            if field is not None and len(delta) == 2 and len(data) == 3:
                head = self._head(data["index"], delta["type"], field)
                return b"".join((head, _dumps(delta[field]).encode(), b"}}\n\n"))
        return event_frame(name, data)

    def _head(self, index: int, kind: str, field: str) -> bytes:
        head = self._heads.get((index, kind))
        if head is None:
            head = (
                f'event: content_block_delta\ndata: {{"type":"content_block_delta","index":{index},'
                f'"delta":{{"type":"{kind}","{field}":'
            ).encode()
            self._heads[(index, kind)] = head
        return head


PING = b'event: ping\ndata: {"type":"ping"}\n\n'  # Anthropic's keep-alive


async def messages_sse(events: AsyncStream[tuple[str, dict[str, Any]]]) -> AsyncGenerator[bytes, None]:
    """Messages framing: ``event: <name>`` and one ``data:`` line per event."""
    framer = MessagesFramer()
    async for name, data in events:
        yield framer.frame(name, data)


def messages_failure(exc: BaseException) -> bytes:
    """The ``error`` event of a Messages stream that failed before its first event."""
    error = exc if isinstance(exc, APIError) else InternalServerError()
    return event_frame("error", anthropic_error(error)[1])
