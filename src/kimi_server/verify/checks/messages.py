"""Anthropic's Messages API (``POST /v1/messages``), checked as an Anthropic client uses it:
``x-api-key`` and ``anthropic-version``, the Message object, its event stream, a forced tool
call then its result, a thinking block sent back (and a tampered one refused). The errors, the
token count, the cache and the model list are in ``messages_door.py``."""

from __future__ import annotations

from typing import Any

import jsonschema

from kimi_server.verify import anthropic as door
from kimi_server.verify.answers import reasons_anyway
from kimi_server.verify.anthropic_message import check_message, rebuild, signed_thinking
from kimi_server.verify.outcome import Failed, expect
from kimi_server.verify.registry import check
from kimi_server.verify.schemas import WEATHER
from kimi_server.verify.target import ACCEPT_TOKENS, Target

GROUP = "messages"
_FN = WEATHER["function"]
TOOL = {"name": _FN["name"], "description": _FN["description"], "input_schema": _FN["parameters"]}


def created(t: Target, model: str) -> dict[str, Any]:
    """A short answer, asked once per run: the message and its ``request-id`` header."""

    def ask() -> dict[str, Any]:
        resp = door.post(t, door.body(t, model))
        return {"message": door.answered(resp), "request_id": resp.headers.get("request-id")}

    return t.once(f"messages:{model}", ask)


def _kinds(m: dict[str, Any]) -> str:
    return ", ".join(b["type"] for b in m["content"]) or "no blocks"


@check(GROUP, "x-api-key, anthropic-version, request-id")
def api_key_header(t: Target, model: str) -> str:
    request_id = created(t, model)["request_id"]
    expect(bool(request_id), "no request-id header on the answer")
    return f"request-id {request_id}"


@check(GROUP, "Bearer key accepted")
def bearer(t: Target, model: str) -> None:
    door.answered(door.post(t, door.body(t, model, max_tokens=ACCEPT_TOKENS), bearer=True))


@check(GROUP, "message object")
def message_object(t: Target, model: str) -> str:
    m = created(t, model)["message"]
    check_message(m, "message")
    return f"{_kinds(m)}; {m['stop_reason']}"


@check(GROUP, "thinking block signed")
def thinking_signed(t: Target, model: str) -> str:
    block = _thinking(t, model)
    return f"{len(block['thinking'])} characters of thinking, a {len(block['signature'])}-character signature"


def _thinking(t: Target, model: str) -> dict[str, Any]:
    """The answer's thinking block; a skip where the model does not reason at all."""
    m = created(t, model)["message"]
    block = signed_thinking(m)
    if block is None:
        reasons_anyway(t, model)
        raise Failed(f"no thinking block in the message ({_kinds(m)}), though the model reasons on chat")
    expect(bool(block.get("signature")), "the thinking block has no signature")
    return block


@check(GROUP, "stream events")
def stream_events(t: Target, model: str) -> str:
    events = door.events(t, door.body(t, model, stream=True))
    message = rebuild(events)
    check_message(message, "the message the stream builds")
    return f"{len(events)} events in order; {_kinds(message)}; {message['stop_reason']}"


@check(GROUP, "forced tool, then tool_result")
def tool_round_trip(t: Target, model: str) -> str:
    question = [{"role": "user", "content": "What is the weather in Paris right now?"}]
    forced = {"type": "tool", "name": TOOL["name"], "disable_parallel_tool_use": True}
    asked = door.body(t, model, messages=question, tools=[TOOL], tool_choice=forced)
    m = door.answered(door.post(t, asked), "the forced call")
    check_message(m, "the forced call")
    calls = [b for b in m["content"] if b["type"] == "tool_use"]
    expect(bool(calls), f"no tool_use block: {_kinds(m)}")
    call = calls[0]
    expect(call["name"] == TOOL["name"], f"tool_use names {call['name']!r}")
    expect(m["stop_reason"] == "tool_use", f"stop_reason {m['stop_reason']!r} after a tool call")
    try:
        jsonschema.validate(call["input"], TOOL["input_schema"])
    except jsonschema.ValidationError as exc:
        raise Failed(f"the input {call['input']} breaks the schema: {exc.message}") from None
    result = {"type": "tool_result", "tool_use_id": call["id"], "content": "Sunny, 21 C."}
    turns = [*question, {"role": "assistant", "content": m["content"]}, {"role": "user", "content": [result]}]
    follow = door.body(t, model, max_tokens=ACCEPT_TOKENS, messages=turns, tools=[TOOL])
    check_message(door.answered(door.post(t, follow), "the tool_result turn"), "the tool_result turn")
    return f"input {call['input']}; the tool_result turn answered"


@check(GROUP, "thinking sent back; tampered refused")
def thinking_returned(t: Target, model: str) -> str:
    block = _thinking(t, model)
    m = created(t, model)["message"]
    answer = [b for b in m["content"] if b["type"] == "text"] or [{"type": "text", "text": "OK"}]

    def conversation(thinking: dict[str, Any]) -> dict[str, Any]:
        turns = [*door.SAY_OK, {"role": "assistant", "content": [thinking, *answer]}]
        turns.append({"role": "user", "content": "Thanks. Reply with OK again."})
        return door.body(t, model, max_tokens=ACCEPT_TOKENS, messages=turns)

    door.answered(door.post(t, conversation(block)), "the signed block sent back")
    tampered = {**block, "signature": _tamper(block["signature"])}
    door.refused(t, conversation(tampered), names="signature", where="a tampered signature")
    return "accepted as signed; one character changed: 400 naming the signature"


def _tamper(signature: str) -> str:
    """The signature with one character in its middle changed (still in its alphabet)."""
    middle = len(signature) // 2
    swapped = "B" if signature[middle] == "A" else "A"
    return signature[:middle] + swapped + signature[middle + 1 :]
