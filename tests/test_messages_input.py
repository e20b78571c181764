"""The Messages conversation as the model reads it: tool calls and results, thinking sent back
(its signature verified, as encrypted_content is), web searches sent back, and the images the
media checks must see."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from kimi_server.engines.types import Message, ToolCallRecord
from kimi_server.engines.web_search_tool import WEB_SEARCH_NAME
from kimi_server.media.intake import apply
from kimi_server.protocol.messages import MessagesRequest
from kimi_server.serving.messages_input import RESULT_SEAL, media_parts
from tests.messages_util import KEY, SEALER, body, plan, refused

ASK = {"role": "user", "content": "Weather in Paris?"}


def conversation(*messages: dict[str, Any], images: bool = False) -> tuple[Message, ...]:
    return plan({**body(), "messages": [*messages]}, images=images).gen.messages


def test_system_string_and_system_role_entries_keep_their_place() -> None:
    raw = {
        **body(),
        "system": "Be brief.",
        "messages": [ASK, {"role": "system", "content": [{"type": "text", "text": "Now in French."}]}, ASK],
    }
    messages = plan(raw).gen.messages
    assert [(m.role, m.text) for m in messages] == [
        ("system", "Be brief."),
        ("user", "Weather in Paris?"),
        ("system", "Now in French."),
        ("user", "Weather in Paris?"),
    ]


def test_tool_use_and_tool_result_become_a_call_and_its_tool_message() -> None:
    call = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris", "unit": "°C"}}
    failed = {"type": "tool_result", "tool_use_id": "toolu_2", "content": "timeout", "is_error": True}
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "18°C"}]}
    messages = conversation(
        ASK,
        {"role": "assistant", "content": [{"type": "text", "text": "Checking."}, call]},
        {"role": "user", "content": [result, failed, {"type": "text", "text": "And tomorrow?"}]},
    )
    assistant = messages[1]
    assert assistant.text == "Checking."
    assert assistant.tool_calls == (
        ToolCallRecord("toolu_1", "get_weather", json.dumps(call["input"], ensure_ascii=False)),
    )
    assert [(m.role, m.tool_call_id, m.text) for m in messages[2:]] == [
        ("tool", "toolu_1", "18°C"),
        ("tool", "toolu_2", "Error: timeout"),  # is_error, made visible to the model
        ("user", None, "And tomorrow?"),
    ]


def test_tool_result_images_and_media_parts() -> None:
    png = base64.b64encode(b"\x89PNG fake").decode()
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}}
    remote = {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}}
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "shot"}, image]}
    raw = {
        **body(),
        "messages": [
            {"role": "user", "content": [remote, {"type": "text", "text": "and this"}]},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "toolu_1", "name": "screenshot", "input": {}}],
            },
            {"role": "user", "content": [result]},
        ],
    }
    parsed = MessagesRequest.model_validate(raw)
    parts = media_parts(parsed)
    data_url = f"data:image/png;base64,{png}"
    assert parts == [
        ("messages[0].content[0]", "image", "https://example.com/cat.jpg"),
        ("messages[2].content[0].content[1]", "image", data_url),
    ]
    gen = plan(raw, images=True).gen
    assert gen.messages[0].images == ("https://example.com/cat.jpg",)
    assert gen.messages[2].role == "tool" and gen.messages[2].images == (data_url,)
    # the media checks' answers replace exactly these URLs
    checked = apply(gen, {url: f"checked:{where}" for where, _, url in parts})
    assert checked.messages[2].images == ("checked:messages[2].content[0].content[1]",)
    assert refused(raw).param == "messages[0].content[0]"  # a model that cannot see


def _thinking(text: str, signature: str) -> dict[str, Any]:
    return {"type": "thinking", "thinking": text, "signature": signature}


def _answered(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {**body(), "messages": [ASK, {"role": "assistant", "content": [*blocks]}, {"role": "user", "content": "ok"}]}


def test_a_thinking_block_sent_back_restores_the_reasoning() -> None:
    signature = SEALER.seal("Paris is in France.", key_id=KEY)
    for shown in ("Paris is in France.", ""):  # as returned, or with the display omitted
        messages = plan(_answered(_thinking(shown, signature), {"type": "text", "text": "Sunny."})).gen.messages
        assert messages[1] == Message("assistant", "Sunny.", reasoning="Paris is in France.")


def test_a_tampered_or_foreign_signature_is_refused() -> None:
    signature = SEALER.seal("Paris is in France.", key_id=KEY)
    tampered = signature[:-6] + ("AAAAAA" if not signature.endswith("AAAAAA") else "BBBBBB")
    for bad in (
        tampered,
        SEALER.seal("x", key_id="another-key"),
        SEALER.seal("x", key_id=KEY, purpose=RESULT_SEAL),
        "EqQBCkgIBhABGAI",
    ):
        error = refused(_answered(_thinking("", bad), {"type": "text", "text": "Sunny."}))
        assert error.param == "messages[1].content[0].signature" and error.code == "invalid_signature"
    error = refused(_answered(_thinking("Paris is in Spain.", signature)))
    assert error.param == "messages[1].content[0].thinking"


def test_redacted_thinking_is_used_when_ours_and_dropped_otherwise() -> None:
    ours = SEALER.seal("hidden", key_id=KEY)
    messages = plan(_answered({"type": "redacted_thinking", "data": ours}, {"type": "text", "text": "A"})).gen.messages
    assert messages[1].reasoning == "hidden"
    messages = plan(
        _answered({"type": "redacted_thinking", "data": "EmwKAhgBEgy3va"}, {"type": "text", "text": "A"})
    ).gen.messages
    assert messages[1] == Message("assistant", "A")


def test_a_web_search_sent_back_is_the_search_call_and_what_it_found() -> None:
    snippet = SEALER.seal("The lighthouse is teal.", key_id=KEY, purpose=RESULT_SEAL)
    results = [
        {
            "type": "web_search_result",
            "url": "https://a.example/l",
            "title": "Lighthouse",
            "encrypted_content": snippet,
        },
        {
            "type": "web_search_result",
            "url": "https://b.example/x",
            "title": "Elsewhere",
            "encrypted_content": "Eq0BCiw",
        },
    ]
    raw = _answered(
        _thinking("", SEALER.seal("I should search.", key_id=KEY)),
        {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "lighthouse colour"}},
        {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": results},
        {"type": "text", "text": "It is teal."},
    )
    messages = plan(raw).gen.messages
    call = ToolCallRecord("srvtoolu_1", WEB_SEARCH_NAME, '{"query": "lighthouse colour"}', "builtin_function")
    assert messages[1] == Message("assistant", "", reasoning="I should search.", tool_calls=(call,))
    found = messages[2]
    assert found.role == "tool" and found.tool_call_id == "srvtoolu_1"
    assert "'lighthouse colour'" in found.text and "The lighthouse is teal." in found.text
    assert "Elsewhere" in found.text and "https://b.example/x" in found.text  # another's blob: title and URL only
    assert messages[3] == Message("assistant", "It is teal.")
    error = {"type": "web_search_tool_result_error", "error_code": "max_uses_exceeded"}
    raw = _answered(
        {"type": "server_tool_use", "id": "srvtoolu_2", "name": "web_search", "input": {"query": "q"}},
        {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_2", "content": error},
    )
    assert "failed: max_uses_exceeded" in plan(raw).gen.messages[2].text
    fetch = {"type": "server_tool_use", "id": "srvtoolu_3", "name": "web_fetch", "input": {"url": "https://a"}}
    assert refused(_answered(fetch)).param == "messages[1].content[0].name"


# --- context_management -----------------------------------------------------------------------


def _turns(n: int) -> list[dict[str, Any]]:
    """``n`` user/assistant exchanges, each assistant turn with its sealed thinking, then a question."""
    out: list[dict[str, Any]] = []
    for i in range(n):
        thought = f"thought {i}"
        signature = SEALER.seal(thought, key_id=KEY)
        out.append({"role": "user", "content": f"q{i}"})
        out.append(
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": thought, "signature": signature},
                    {"type": "text", "text": f"a{i}"},
                ],
            }
        )
    return [*out, {"role": "user", "content": "last"}]


def _reasoning_kept(edits: list[dict[str, Any]] | None) -> list[str | None]:
    raw = {**body(), "messages": _turns(3)}
    if edits is not None:
        raw["context_management"] = {"edits": edits}
    return [m.reasoning for m in plan(raw).gen.messages if m.role == "assistant"]


def test_clear_thinking_keeps_what_it_is_told() -> None:
    assert _reasoning_kept(None) == ["thought 0", "thought 1", "thought 2"]
    assert _reasoning_kept([{"type": "clear_thinking_20251015", "keep": "all"}]) == [
        "thought 0",
        "thought 1",
        "thought 2",
    ]
    assert _reasoning_kept([{"type": "clear_thinking_20251015", "keep": {"type": "all"}}])[0] == "thought 0"
    assert _reasoning_kept([{"type": "clear_thinking_20251015"}]) == [None, None, "thought 2"]  # Anthropic's default: 1
    two = [{"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 2}}]
    assert _reasoning_kept(two) == [None, "thought 1", "thought 2"]
    none = [{"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 0}}]
    assert _reasoning_kept(none) == [None, None, None]


@pytest.mark.parametrize(
    ("edit", "param"),
    [
        ({"type": "clear_tool_uses_20250919"}, "context_management.edits[0].type"),
        ({"type": "compact_20260112"}, "context_management.edits[0].type"),
        ({"type": "clear_thinking_20251015", "keep": "some"}, "context_management.edits[0].keep"),
        (
            {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": -1}},
            "context_management.edits[0].keep.value",
        ),
    ],
)
def test_edits_that_would_clear_what_this_server_keeps_are_refused(edit: dict[str, Any], param: str) -> None:
    assert refused(body(context_management={"edits": [edit]})).param == param
