"""Chat chunks framed by the per-stream template are byte for byte what encoding each chunk
whole gives, for every shape a stream has: role, reasoning, content, tool calls, the finish,
the usage chunk, an error, and a new stream (another id) through the same framer."""

from __future__ import annotations

from typing import Any

from kimi_server.http.sse import ChunkFramer, data_frame


def chunk(
    delta: dict[str, Any],
    finish: str | None = None,
    *,
    usage: bool = False,
    cid: str = "chatcmpl-1",
    model: str = "kimi-k3",
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": cid,
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
    }
    if usage:
        out["usage"] = None
    return out


def test_every_chunk_shape_frames_as_encoded_whole() -> None:
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": "é\\n"}'}}
    stream = [
        chunk({"role": "assistant"}),
        chunk({"reasoning_content": 'Let me think "quoted" — ünïcode ✓'}),
        chunk({"content": "Hello\n\tthere </script> \u2028"}),
        chunk({"tool_calls": [call]}),
        chunk({}, "tool_calls"),
        chunk({"content": "x"}, usage=True),
        chunk({}, "stop", usage=True),
        {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": 1_700_000_000,
            "model": "kimi-k3",
            "choices": [],
            "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
        },
        {"error": {"message": "boom", "type": "server_error", "code": None, "param": None}},
        chunk({"content": "next stream"}, cid="chatcmpl-2", model="kimi-k3.1-pro"),
        chunk({"content": "logprobs"})
        | {"choices": [{"index": 0, "delta": {}, "finish_reason": None, "logprobs": {"content": []}}]},
    ]
    framer = ChunkFramer()
    for item in stream:
        assert framer.frame(item) == data_frame(item), item


def _events() -> list[Any]:
    from kimi_server.engines.types import ContentDelta, Finish, ReasoningDelta, ToolCallDelta, Usage

    return [
        ReasoningDelta('Let me think "quoted" — ünïcode ✓'),
        ContentDelta("Hello\n\tthere </script> \u2028"),
        ContentDelta(""),
        ToolCallDelta(0, "call_1", "f", '{"a": "é\\n"}'),
        ToolCallDelta(0, arguments="more"),
        ToolCallDelta(1, "call_2", "$web_search", "", "builtin_function"),
        ReasoningDelta("late thought"),
        Finish("tool_calls", Usage(5, 2, 1, 7, 3)),
    ]


async def _collect(frames: Any) -> bytes:
    return b"".join([frame async for frame in frames])


async def _source(events: list[Any], fail: bool = False) -> Any:
    from kimi_server.errors import InvalidRequestError

    for event in events:
        yield event
    if fail:
        raise InvalidRequestError("bad", code="x")


def test_chat_event_stream_is_the_chunk_stream_framed_byte_for_byte(monkeypatch: Any) -> None:
    """The one-generator stream (text deltas framed from the template) sends what building each
    chunk and framing it sends, for every event shape, with and without the usage chunk, and
    when the engine fails mid-stream."""
    import asyncio

    from kimi_server.http.sse import chat_event_sse, chat_sse
    from kimi_server.serving import chat

    monkeypatch.setattr(chat, "new_id", lambda prefix: prefix + "fixed")
    monkeypatch.setattr(chat, "now", lambda: 1_700_000_000)
    for include_usage in (False, True):
        for fail in (False, True):
            events = _events()[:-1] if fail else _events()
            general = asyncio.run(
                _collect(chat_sse(chat.stream_chunks(_source(events, fail), "kimi-k3", include_usage=include_usage)))
            )
            fused = asyncio.run(_collect(chat_event_sse(_source(events, fail), "kimi-k3", include_usage=include_usage)))
            assert fused == general
            assert b'"content":"Hello' in fused and fused.endswith(b"data: [DONE]\n\n")


def test_messages_framer_is_event_frame_byte_for_byte() -> None:
    from kimi_server.http.sse import MessagesFramer, event_frame

    framer = MessagesFramer()
    texts = ["plain", 'quote " and \\ back', "line\nbreak", "é 漢字 🙂", "\u2028\x00", ""]
    for index in (0, 3, 12):
        for kind, field in (("text_delta", "text"), ("thinking_delta", "thinking")):
            for text in texts:
                delta: dict[str, Any] = {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": kind, field: text},
                }
                assert framer.frame("content_block_delta", delta) == event_frame("content_block_delta", delta)
    # Every other event is framed whole, the same way.
    others: list[tuple[str, dict[str, Any]]] = [
        (
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "s"}},
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    for name, data in others:
        assert framer.frame(name, data) == event_frame(name, data)
