"""Partial Mode through upstream engines, each fake speaking its engine's wire protocol on a real
socket: the prefix leaves in the dialect's native form (Moonshot's ``partial`` flag, vLLM's
``continue_final_message``, llama.cpp's server continuing a final assistant message), and the
client hears the continuation once, whether the upstream repeats the prefix or not. A dialect
without Partial Mode is a 400 before anything reaches the upstream."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.upstreams.fake import Conn, FakeUpstream, chunk
from tests.upstreams.front import config, front

PREFIX = "Once upon a time"
CONTINUATION = ", a fox found a key."
MESSAGES: Any = [
    {"role": "user", "content": "Tell me a story."},
    {"role": "assistant", "content": PREFIX, "partial": True, "name": "Narrator"},
]


def story(echo: bool) -> Any:
    """An upstream that continues the last message, repeating it first where ``echo`` (engines
    differ on that), split so the repeated prefix spans several chunks."""

    async def handler(body: dict[str, Any], c: Conn) -> None:
        await c.head()
        await c.event(chunk({"role": "assistant", "content": ""}))
        await c.event(chunk({"reasoning_content": "A fable."}))
        text = (PREFIX if echo else "") + CONTINUATION
        for i in range(0, len(text), 5):
            await c.event(chunk({"content": text[i : i + 5]}))
        usage = {"prompt_tokens": 12, "completion_tokens": 9, "total_tokens": 21}
        await c.event(chunk({}, "stop", usage=usage))
        await c.done()

    return handler


NATIVE = {
    "moonshot": ({"role": "assistant", "content": PREFIX, "name": "Narrator", "partial": True}, {}),
    "vllm": (
        {"role": "assistant", "content": PREFIX, "name": "Narrator"},
        {"continue_final_message": True, "add_generation_prompt": False},
    ),
    "llamacpp": ({"role": "assistant", "content": PREFIX, "name": "Narrator"}, {}),
}


@pytest.mark.parametrize("echo", [False, True], ids=["continuation-only", "echoes-prefix"])
@pytest.mark.parametrize("dialect", list(NATIVE))
def test_native_dialects_carry_the_prefix_and_the_client_hears_it_once(
    dialect: str, echo: bool, tmp_path: Path
) -> None:
    last, fields = NATIVE[dialect]
    with FakeUpstream(story(echo)) as up, front(tmp_path, config(up.url, dialect=dialect)) as f:
        r = f.sdk.chat.completions.create(model="kimi-k3.1-pro", messages=MESSAGES, max_completion_tokens=50)
        assert r.choices[0].message.content == CONTINUATION
        assert (r.choices[0].message.model_extra or {})["reasoning_content"] == "A fable."
        chunks = list(
            f.sdk.chat.completions.create(
                model="kimi-k3.1-pro", messages=MESSAGES, max_completion_tokens=50, stream=True
            )
        )
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == CONTINUATION
        sent = up.bodies[0]
    assert sent["messages"][-1] == last
    assert sent["messages"][0] == {"role": "user", "content": "Tell me a story."}
    for name, value in fields.items():
        assert sent[name] == value
    if dialect != "moonshot":
        assert all("partial" not in m for m in sent["messages"])


@pytest.mark.parametrize("dialect", ["openai", "sglang"])
def test_a_dialect_without_partial_mode_is_a_400_before_any_upstream_call(dialect: str, tmp_path: Path) -> None:
    with FakeUpstream(story(False)) as up, front(tmp_path, config(up.url, dialect=dialect)) as f:
        r = f.http.post("/v1/chat/completions", json={"model": "kimi-k3.1-pro", "messages": MESSAGES})
        assert r.status_code == 400
        error = r.json()["error"]
        assert error["param"] == "messages[1].partial" and "Partial Mode" in error["message"]
        assert up.bodies == []


def test_a_continuation_that_only_starts_like_the_prefix_is_kept_whole(tmp_path: Path) -> None:
    """Held while it may be the prefix repeated, then given whole once it is not."""

    async def short(body: dict[str, Any], c: Conn) -> None:
        await c.head()
        for piece in ("Once", " more."):
            await c.event(chunk({"content": piece}))
        await c.event(chunk({}, "stop", usage={"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}))
        await c.done()

    with FakeUpstream(short) as up, front(tmp_path, config(up.url, dialect="vllm")) as f:
        r = f.sdk.chat.completions.create(model="kimi-k3.1-pro", messages=MESSAGES, max_completion_tokens=50)
        assert r.choices[0].message.content == "Once more."


@pytest.mark.parametrize("dialect", ["vllm", "llamacpp"])
def test_a_json_prefix_is_refused_where_the_upstream_grammar_starts_afresh(dialect: str, tmp_path: Path) -> None:
    """Their grammars constrain only generated tokens: the answer would be a second value."""
    prefixed = [MESSAGES[0], {"role": "assistant", "content": '{"a": ', "partial": True}]
    fmt = {"type": "json_object"}
    with FakeUpstream(story(False)) as up, front(tmp_path, config(up.url, dialect=dialect)) as f:
        r = f.http.post(
            "/v1/chat/completions", json={"model": "kimi-k3.1-pro", "messages": prefixed, "response_format": fmt}
        )
        assert r.status_code == 400 and r.json()["error"]["param"] == "messages[1].partial"
        assert up.bodies == []


def test_moonshot_takes_a_json_prefix_natively(tmp_path: Path) -> None:
    prefixed = [MESSAGES[0], {"role": "assistant", "content": '{"a": ', "partial": True}]
    with FakeUpstream(story(False)) as up, front(tmp_path, config(up.url, dialect="moonshot")) as f:
        f.sdk.chat.completions.create(
            model="kimi-k3.1-pro", messages=prefixed, response_format={"type": "json_object"}, max_completion_tokens=50
        )
        sent = up.bodies[0]
    assert sent["messages"][-1] == {"role": "assistant", "content": '{"a": ', "partial": True}
    assert sent["response_format"] == {"type": "json_object"}
