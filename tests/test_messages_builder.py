"""The Messages builder over scripted engine events: every final object validates as the SDK's
``Message``, and the streamed events, parsed into the SDK's event types and run through its own
accumulator (and through the SDK client itself, over an in-process transport), rebuild exactly
the object ``complete`` returns."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any

import anthropic
import httpx2
import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message as SDKMessage
from anthropic.types import RawMessageStreamEvent
from pydantic import TypeAdapter

from kimi_server.engines.types import (
    ContentDelta,
    EngineEvent,
    Finish,
    ReasoningDelta,
    ToolCallDelta,
    Usage,
)
from kimi_server.errors import APIError, EngineUnavailableError, InternalServerError
from kimi_server.serving import messages
from kimi_server.serving.messages import Event
from kimi_server.serving.messages_blocks import ToolInputError
from kimi_server.serving.messages_request import MessagesPlan
from tests.messages_util import KEY, SEALER, body, plan

STREAM_EVENT: TypeAdapter[Any] = TypeAdapter(RawMessageStreamEvent)
USAGE = Usage(prompt_tokens=30, cached_tokens=10, completion_tokens=7, reasoning_tokens=3)
WEATHER = {
    "name": "get_weather",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def _plan(**fields: Any) -> MessagesPlan:
    return plan(body(**fields))


def script(*events: EngineEvent, fail: Exception | None = None) -> Callable[[], AsyncGenerator[EngineEvent, None]]:
    async def run() -> AsyncGenerator[EngineEvent, None]:
        for e in events:
            yield e
        if fail is not None:
            raise fail

    return run


def streamed(p: MessagesPlan, events: Callable[[], AsyncGenerator[EngineEvent, None]], **kw: Any) -> list[Event]:
    async def run() -> list[Event]:
        return [e async for e in messages.stream(p, SEALER, events(), **kw)]

    return asyncio.run(run())


def completed(p: MessagesPlan, events: Callable[[], AsyncGenerator[EngineEvent, None]], **kw: Any) -> dict[str, Any]:
    return asyncio.run(messages.complete(p, SEALER, events(), **kw))


def accumulated(events: Sequence[Event]) -> dict[str, Any]:
    """The SDK's own reading of the stream: each event parsed into its type (its name must be
    the data's type), fed through its accumulator."""
    snapshot = None
    buffers: dict[int, bytes] = {}
    for name, data in events:
        assert name == data["type"]
        event = STREAM_EVENT.validate_python(data)
        snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=buffers)
    assert snapshot is not None
    return normal(snapshot.to_dict())


def normal(message: dict[str, Any]) -> dict[str, Any]:
    """A Message as the SDK reads it (strictly), every field present."""
    return SDKMessage.model_validate(message, strict=False).model_dump(mode="json")


def both(
    p: MessagesPlan, events: Callable[[], AsyncGenerator[EngineEvent, None]]
) -> tuple[dict[str, Any], list[Event]]:
    """The final object and the stream, checked to agree."""
    final = completed(p, events)
    stream = streamed(p, events)
    final_view = normal(final)
    stream_view = accumulated(stream)
    final_view["id"] = stream_view["id"]  # each run names its message afresh
    signatures(final_view, stream_view)
    assert renamed(stream_view) == renamed(final_view)
    return final, stream


def renamed(view: dict[str, Any]) -> dict[str, Any]:
    """Block ids (new on each run) replaced by their order, references to them alike."""
    names: dict[str, str] = {}
    for block in view["content"]:
        if "id" in block:
            block["id"] = names.setdefault(block["id"], f"id{len(names)}")
        if "tool_use_id" in block:
            block["tool_use_id"] = names.get(block["tool_use_id"], "unknown")
    return view


def signatures(*views: dict[str, Any]) -> None:
    """Signatures are sealed afresh on each run: checked to open to the same text, then blanked."""
    opened = []
    for view in views:
        for block in view["content"]:
            if block["type"] == "thinking":
                opened.append(SEALER.open(block["signature"], key_id=KEY, param="signature"))
                block["signature"] = ""
    assert opened[: len(opened) // 2] == opened[len(opened) // 2 :]


def kinds(stream: Sequence[Event]) -> list[str]:
    out = []
    for name, data in stream:
        delta = data.get("delta", {}).get("type") if name == "content_block_delta" else None
        out.append(f"{name}:{delta}" if delta else name)
    return out


def test_text_only() -> None:
    final, stream = both(_plan(), script(ContentDelta("Hello"), ContentDelta(" there."), Finish("stop", USAGE)))
    assert final["id"].startswith("msg_") and final["model"] == "kimi-k3.1-pro" and final["role"] == "assistant"
    assert final["content"] == [{"type": "text", "text": "Hello there."}]
    assert final["stop_reason"] == "end_turn" and final["stop_sequence"] is None
    assert kinds(stream) == [
        "message_start",
        "content_block_start",
        "content_block_delta:text_delta",
        "content_block_delta:text_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]


def test_thinking_then_text_with_a_sealed_signature() -> None:
    events = script(ReasoningDelta("Let me "), ReasoningDelta("think."), ContentDelta("Hi"), Finish("stop", USAGE))
    final, stream = both(_plan(), events)
    thinking, text = final["content"]
    assert thinking["type"] == "thinking" and thinking["thinking"] == "Let me think."
    assert SEALER.open(thinking["signature"], key_id=KEY, param="s") == "Let me think."
    assert text == {"type": "text", "text": "Hi"}
    assert kinds(stream)[1:6] == [
        "content_block_start",
        "content_block_delta:thinking_delta",
        "content_block_delta:thinking_delta",
        "content_block_delta:signature_delta",  # at the block's end, the whole reasoning sealed
        "content_block_stop",
    ]
    # Sent back as returned, the block restores the reasoning (serving/messages_input.py).
    back = {
        **body(),
        "messages": [
            body()["messages"][0],
            {"role": "assistant", "content": final["content"]},
            {"role": "user", "content": "more"},
        ],
    }
    assert plan(back).gen.messages[1].reasoning == "Let me think."


def test_display_omitted_sends_the_signature_without_the_text() -> None:
    p = _plan(thinking={"type": "adaptive", "display": "omitted"})
    final, stream = both(
        p, script(ReasoningDelta("secret "), ReasoningDelta("plan"), ContentDelta("Done"), Finish("stop", USAGE))
    )
    assert final["content"][0]["thinking"] == ""
    assert SEALER.open(final["content"][0]["signature"], key_id=KEY, param="s") == "secret plan"
    assert "content_block_delta:thinking_delta" not in kinds(stream)
    assert all("secret" not in json.dumps(data) for _, data in stream)


def test_reasoning_switched_off_has_no_thinking_block() -> None:
    from kimi_server.policy.profiles import MOONSHOT

    p = plan(body(thinking={"type": "disabled"}), contracts={"kimi-k3.1-pro": MOONSHOT})
    final, _ = both(p, script(ReasoningDelta("ignored"), ContentDelta("Hi"), Finish("stop", USAGE)))
    assert [b["type"] for b in final["content"]] == ["text"]


def test_tool_calls_with_streamed_input() -> None:
    events = script(
        ReasoningDelta("Need weather."),
        ToolCallDelta(0, "call_a", "get_weather", '{"city":'),
        ToolCallDelta(0, arguments=' "Paris"}'),
        ToolCallDelta(1, "call_b", "get_weather", ""),
        Finish("tool_calls", USAGE),
    )
    final, stream = both(_plan(tools=[WEATHER]), events)
    _, first, second = final["content"]
    assert first["type"] == second["type"] == "tool_use"
    assert first["input"] == {"city": "Paris"} and second["input"] == {}
    assert first["id"].startswith("toolu_") and first["id"] != second["id"] and first["name"] == "get_weather"
    assert final["stop_reason"] == "tool_use"
    starts = [data["content_block"] for name, data in stream if name == "content_block_start"]
    assert starts[1] == {"type": "tool_use", "id": starts[1]["id"], "name": "get_weather", "input": {}}
    partial = [
        data["delta"]["partial_json"] for name, data in stream if name == "content_block_delta" and data["index"] == 1
    ]
    assert partial == ['{"city":', ' "Paris"}']


def test_stop_sequence_and_max_tokens() -> None:
    final, stream = both(_plan(stop_sequences=["END"]), script(ContentDelta("1 2 3"), Finish("stop", USAGE, "END")))
    assert final["stop_reason"] == "stop_sequence" and final["stop_sequence"] == "END"
    message_delta = next(data for name, data in stream if name == "message_delta")
    assert message_delta["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}
    final, _ = both(_plan(), script(ReasoningDelta("long"), ContentDelta("cut"), Finish("length", USAGE)))
    assert final["stop_reason"] == "max_tokens" and final["content"][1] == {"type": "text", "text": "cut"}
    final, _ = both(_plan(), script(ReasoningDelta("only thinking"), Finish("length", USAGE)))
    assert [b["type"] for b in final["content"]] == ["thinking"]  # cut: no answer invented


def test_an_answer_without_text_still_has_its_text_block() -> None:
    final, _ = both(_plan(), script(ReasoningDelta("hmm"), Finish("stop", USAGE)))
    assert final["content"][1] == {"type": "text", "text": ""} and final["stop_reason"] == "end_turn"


def test_usage_is_anthropics_split_of_the_prompt() -> None:
    usage = Usage(prompt_tokens=100, cached_tokens=60, cache_write_tokens=30, completion_tokens=9, reasoning_tokens=4)
    for ttl, split in (("5m", (30, 0)), ("1h", (0, 30))):
        p = _plan(cache_control={"type": "ephemeral", "ttl": ttl})
        events = script(ContentDelta("x"), Finish("stop", usage))
        final = completed(p, events, prompt_tokens=100)
        assert final["usage"] == {
            "input_tokens": 10,
            "cache_creation_input_tokens": 30,
            "cache_read_input_tokens": 60,
            "cache_creation": {"ephemeral_5m_input_tokens": split[0], "ephemeral_1h_input_tokens": split[1]},
            "output_tokens": 9,
            "output_tokens_details": {"thinking_tokens": 4},
        }
        stream = streamed(p, events, prompt_tokens=100)
        start = stream[0][1]["message"]["usage"]
        assert start["input_tokens"] == 100 and start["output_tokens"] == 0  # known before generating
        delta = next(data for name, data in stream if name == "message_delta")
        assert delta["usage"] == final["usage"]  # the whole split, in the raw event
        # The SDK's accumulator takes every count from message_delta but not the TTL split (its
        # MessageDeltaUsage has no such field): only that part of its snapshot stays as started.
        view = accumulated(stream)
        assert view["usage"]["cache_creation"] == {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0}
        assert {k: v for k, v in view["usage"].items() if v is not None and k != "cache_creation"} == {
            k: v for k, v in final["usage"].items() if k != "cache_creation"
        }


@pytest.mark.parametrize(
    ("failure", "kind", "message"),
    [
        (RuntimeError("secret internals /etc/x"), "api_error", "The server had an error"),
        (EngineUnavailableError("The engine failed to generate a response."), "overloaded_error", "engine failed"),
    ],
)
def test_a_failure_mid_stream_ends_with_an_error_event(failure: Exception, kind: str, message: str) -> None:
    events = script(ReasoningDelta("a"), ContentDelta("partial"), fail=failure)
    stream = streamed(_plan(), events)
    name, data = stream[-1]
    assert name == "error" and data["type"] == "error"
    assert data["error"]["type"] == kind and message in data["error"]["message"]
    assert "secret" not in json.dumps(data)
    assert "message_stop" not in kinds(stream)
    with pytest.raises(APIError) as caught:
        completed(_plan(), events)
    assert isinstance(caught.value, EngineUnavailableError if kind == "overloaded_error" else InternalServerError)


def test_an_engine_that_ends_without_finish_is_a_failure() -> None:
    stream = streamed(_plan(), script(ContentDelta("x")))
    assert stream[-1][0] == "error" and stream[-1][1]["error"]["type"] == "api_error"


def test_tool_input_that_is_not_a_json_object_fails_the_answer() -> None:
    for junk in ('{"city": "Par', "[1, 2]"):
        events = script(ToolCallDelta(0, "c", "get_weather", junk), Finish("tool_calls", USAGE))
        stream = streamed(_plan(tools=[WEATHER]), events)
        assert stream[-1][0] == "error" and "get_weather" in stream[-1][1]["error"]["message"]
        with pytest.raises(ToolInputError) as caught:
            completed(_plan(tools=[WEATHER]), events)
        assert caught.value.status_code == 502


def test_tool_input_cut_by_the_cap_keeps_what_it_holds() -> None:
    """A call the output cap ended mid-input is no failure: max_tokens, and the input so far."""
    for cut, expected in (
        (
            '{"city": "Par',
            {"city": "Par"},
        ),
        ('{"city": "Paris", "un', {"city": "Paris"}),
        ("{", {}),
    ):
        events = script(ToolCallDelta(0, "c", "get_weather", cut), Finish("length", USAGE))
        message = completed(_plan(tools=[WEATHER]), events)
        assert message["stop_reason"] == "max_tokens"
        assert message["content"][-1] == {**message["content"][-1], "type": "tool_use", "input": expected}
        stream = streamed(_plan(tools=[WEATHER]), events)
        assert stream[-1][0] == "message_stop"


# --- through the SDK client itself --------------------------------------------------------------


def sse(stream: Sequence[Event]) -> bytes:
    frames = [b'event: ping\ndata: {"type": "ping"}\n\n']
    frames += [f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in stream]
    return b"".join(frames)


def client(answer: Callable[[dict[str, Any]], httpx2.Response]) -> anthropic.Anthropic:
    def handle(request: httpx2.Request) -> httpx2.Response:
        return answer(json.loads(request.content))

    transport = httpx2.MockTransport(handle)
    return anthropic.Anthropic(
        api_key="k",
        base_url="http://kimi.test",
        http_client=httpx2.Client(transport=transport),
        max_retries=0,
        _strict_response_validation=True,
    )


TOOL_EVENTS = script(
    ReasoningDelta("Weather needs a call."),
    ContentDelta("Checking."),
    ToolCallDelta(0, "c1", "get_weather", '{"city": "Paris"}'),
    Finish("tool_calls", USAGE),
)


def test_the_sdk_client_reads_the_object_and_the_stream_alike() -> None:
    p = _plan(tools=[WEATHER])
    final = completed(p, TOOL_EVENTS)

    def answer(request: dict[str, Any]) -> httpx2.Response:
        if request.get("stream"):
            headers = {"content-type": "text/event-stream"}
            return httpx2.Response(200, headers=headers, content=sse(streamed(p, TOOL_EVENTS)))
        return httpx2.Response(200, json=final)

    sdk = client(answer)
    ask = {"model": "kimi-k3.1-pro", "max_tokens": 1000, "messages": [{"role": "user", "content": "Paris?"}]}
    created = sdk.messages.create(**ask)  # type: ignore[call-overload]
    assert created.stop_reason == "tool_use" and created.content[2].type == "tool_use"
    with sdk.messages.stream(**ask) as stream:  # type: ignore[arg-type]
        text = "".join(stream.text_stream)
        rebuilt = stream.get_final_message()
    assert text == "Checking."
    mine, theirs = normal(created.to_dict()), normal(rebuilt.to_dict())
    theirs["id"] = mine["id"]
    signatures(mine, theirs)
    assert renamed(mine) == renamed(theirs)


def test_the_sdk_raises_on_an_error_event() -> None:
    p = _plan()
    events = script(ContentDelta("partial"), fail=EngineUnavailableError("The engine failed to generate a response."))

    def answer(request: dict[str, Any]) -> httpx2.Response:
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=sse(streamed(p, events)))

    ask = {"model": "kimi-k3.1-pro", "max_tokens": 1000, "messages": [{"role": "user", "content": "hi"}]}
    with pytest.raises(anthropic.APIStatusError) as caught, client(answer).messages.stream(**ask) as stream:  # type: ignore[arg-type]
        stream.until_done()
    assert isinstance(caught.value.body, dict) and caught.value.body["error"]["type"] == "overloaded_error"
