"""Each dialect's upstream, answering exactly as that engine does on the wire (vLLM's
``reasoning`` / older ``reasoning_content`` and tool-call deltas, SGLang, llama.cpp's server,
Moonshot's API, and an engine run without its parsers leaking ``<think>`` and Kimi's tool-call
markup into the text), normalised to one client-side result; and each dialect's translation of
the catalogue's rules into the request that leaves."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.media_samples import data_url, image, mp4
from tests.upstreams.fake import Conn, FakeUpstream, chunk
from tests.upstreams.front import config, front

REASONING = "Let me think."
ANSWER = "Hello there."
ARGS = '{"city": "Paris"}'


def _usage(**extra: Any) -> dict[str, Any]:
    return {"prompt_tokens": 20, "completion_tokens": 10, "total_tokens": 30, **extra}


async def vllm(body: dict[str, Any], c: Conn, field: str = "reasoning") -> None:
    """vLLM >= 0.11 names the field ``reasoning``; earlier releases ``reasoning_content``."""
    await c.head()
    await c.event(chunk({"role": "assistant", "content": ""}))
    for piece in ("Let me", " think."):
        await c.event(chunk({field: piece}))
    if body.get("tools"):
        await c.event(
            chunk(
                {
                    "tool_calls": [
                        {
                            "id": "chatcmpl-tool-1",
                            "type": "function",
                            "index": 0,
                            "function": {"name": "get_weather", "arguments": ""},
                        }
                    ]
                }
            )
        )
        for piece in ('{"city": ', '"Paris"}'):
            await c.event(chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}))
        await c.event(chunk({"content": ""}, "tool_calls", stop_reason=None))
    else:
        for piece in ("Hello", " there."):
            await c.event(chunk({"content": piece}))
        await c.event(chunk({"content": ""}, "stop", stop_reason=None))
    await c.event({**chunk({}), "choices": [], "usage": _usage()})
    await c.done()


async def vllm_old(body: dict[str, Any], c: Conn) -> None:
    await vllm(body, c, "reasoning_content")


async def sglang(body: dict[str, Any], c: Conn) -> None:
    await c.head()
    await c.event(chunk({"role": "assistant", "content": None, "reasoning_content": None}))
    for piece in ("Let me", " think."):
        await c.event(chunk({"role": None, "content": None, "reasoning_content": piece}))
    if body.get("tools"):
        await c.event(
            chunk(
                {
                    "tool_calls": [
                        {
                            "id": "call_abc",
                            "index": 0,
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": ""},
                        }
                    ]
                }
            )
        )
        await c.event(
            chunk(
                {
                    "tool_calls": [
                        {"id": None, "index": 0, "type": "function", "function": {"name": None, "arguments": ARGS}}
                    ]
                }
            )
        )
        await c.event(chunk({"content": None}, "tool_calls", matched_stop=None))
    else:
        for piece in ("Hello", " there."):
            await c.event(chunk({"content": piece, "reasoning_content": None}))
        await c.event(chunk({"content": None}, "stop", matched_stop=163586))
    await c.event({**chunk({}), "choices": [], "usage": _usage(completion_tokens_details={"reasoning_tokens": 2})})
    await c.done()


async def llamacpp(body: dict[str, Any], c: Conn) -> None:
    """llama-server with ``reasoning_format: deepseek``; usage on a last chunk with timings."""
    await c.head()
    await c.event(chunk({"role": "assistant", "content": None}))
    for piece in ("Let me", " think."):
        await c.event(chunk({"reasoning_content": piece}))
    if body.get("tools"):
        await c.event(
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "kX9",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": ARGS},
                        }
                    ]
                }
            )
        )
        await c.event(chunk({}, "tool_calls"))
    else:
        for piece in ("Hello", " there."):
            await c.event(chunk({"content": piece}))
        await c.event(chunk({}, "stop"))
    usage = _usage(prompt_tokens_details={"cached_tokens": 0})
    await c.event({**chunk({}), "choices": [], "usage": usage, "timings": {"prompt_n": 20}})
    await c.done()


async def moonshot(body: dict[str, Any], c: Conn) -> None:
    """Moonshot's API: usage on the final choice; tool-call ids like ``get_weather:0``."""
    await c.head()
    await c.event(chunk({"role": "assistant", "content": ""}))
    for piece in ("Let me", " think."):
        await c.event(chunk({"reasoning_content": piece}))
    usage = _usage(prompt_tokens_details={"cached_tokens": 8, "cache_write_tokens": 12})
    if body.get("tools"):
        await c.event(
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "get_weather:0",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": ""},
                        }
                    ]
                }
            )
        )
        await c.event(chunk({"tool_calls": [{"index": 0, "function": {"arguments": ARGS}}]}))
        await c.event(chunk({}, "tool_calls", usage=usage))
    else:
        for piece in ("Hello", " there."):
            await c.event(chunk({"content": piece}))
        await c.event(chunk({}, "stop", usage=usage))
    await c.done()


async def leaky(body: dict[str, Any], c: Conn) -> None:
    """An engine run without reasoning / tool-call parsers: tags and markup in the text, split
    at awkward places."""
    await c.head()
    if body.get("tools"):
        text = (
            "<think>Let me think.</think>\n\n<|tool_calls_section_begin|><|tool_call_begin|>"
            'functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}'
            "<|tool_call_end|><|tool_calls_section_end|>"
        )
        finish = "stop"
    else:
        text, finish = "<think>Let me think.</think>\n\nHello there.", "stop"
    for i in range(0, len(text), 5):
        await c.event(chunk({"content": text[i : i + 5]}))
    await c.event(chunk({}, finish))
    await c.event({**chunk({}), "choices": [], "usage": _usage()})
    await c.done()


DIALECTS = {
    "vllm": (vllm, "vllm"),
    "vllm-reasoning_content": (vllm_old, "vllm"),
    "sglang": (sglang, "sglang"),
    "llamacpp": (llamacpp, "llamacpp"),
    "moonshot": (moonshot, "moonshot"),
    "leaky-kimi-markup": (leaky, "vllm"),
}
TOOLS: Any = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
MESSAGES: Any = [{"role": "user", "content": "Hi"}]


@pytest.mark.parametrize("name", list(DIALECTS))
def test_each_dialect_normalises_to_the_same_result(name: str, tmp_path: Path) -> None:
    handler, dialect = DIALECTS[name]
    with FakeUpstream(handler) as up, front(tmp_path, config(up.url, dialect=dialect)) as f:
        plain = f.sdk.chat.completions.create(model="kimi-k3.1-pro", messages=MESSAGES, max_completion_tokens=50)
        msg = plain.choices[0].message
        assert (msg.model_extra or {})["reasoning_content"] == REASONING
        assert msg.content == ANSWER
        assert plain.choices[0].finish_reason == "stop"
        assert plain.usage is not None and plain.usage.prompt_tokens == 20
        assert plain.usage.completion_tokens_details is not None
        # Reported (SGLang) or estimated as one token per streamed reasoning delta.
        reasoning_tokens = plain.usage.completion_tokens_details.reasoning_tokens or 0
        assert reasoning_tokens == 2 if name != "leaky-kimi-markup" else 0 < reasoning_tokens < 10

        stream = list(
            f.sdk.chat.completions.create(
                model="kimi-k3.1-pro", messages=MESSAGES, max_completion_tokens=50, stream=True
            )
        )
        reasoning = "".join(
            (c.choices[0].delta.model_extra or {}).get("reasoning_content") or "" for c in stream if c.choices
        )
        content = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert (reasoning, content) == (REASONING, ANSWER)

        called = f.sdk.chat.completions.create(
            model="kimi-k3.1-pro", messages=MESSAGES, tools=TOOLS, max_completion_tokens=50
        )
        choice = called.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert (choice.message.model_extra or {})["reasoning_content"] == REASONING
        [call] = choice.message.tool_calls or []
        assert call.type == "function" and call.function.name == "get_weather"
        assert json.loads(call.function.arguments) == {"city": "Paris"}
        assert call.id and not (choice.message.content or "").strip()

        resp = f.sdk.responses.create(
            model="kimi-k3.1-pro",
            input="Hi",
            tools=TOOLS
            and [{"type": "function", "name": "get_weather", "parameters": TOOLS[0]["function"]["parameters"]}],
            max_output_tokens=50,
        )
        kinds = [item.type for item in resp.output]
        assert kinds == ["reasoning", "function_call"]


def _body_for(dialect: str, tmp_path: Path, model: str = "kimi-k3.1-pro", **caps: Any) -> dict[str, Any]:
    with (
        FakeUpstream(vllm) as up,
        front(tmp_path, config(up.url, dialect=dialect, model="served-name", capabilities=caps or {})) as f,
    ):
        f.sdk.chat.completions.create(model=model, messages=MESSAGES, max_completion_tokens=50, reasoning_effort="high")
        return up.bodies[0]


def test_effort_and_catalogue_rules_are_translated_per_dialect(tmp_path: Path) -> None:
    body = _body_for("vllm", tmp_path)
    assert body["model"] == "served-name" and body["stream"] is True
    assert body["max_tokens"] == 50 and body["reasoning_effort"] == "medium"
    assert body["chat_template_kwargs"] == {"thinking": True, "reasoning_effort": "high"}
    assert (body["temperature"], body["top_p"]) == (1.0, 0.95)  # the catalogue's fixed sampling

    body = _body_for("sglang", tmp_path)
    assert body["separate_reasoning"] is True and body["chat_template_kwargs"]["thinking"] is True

    body = _body_for("llamacpp", tmp_path)
    assert body["reasoning_format"] == "deepseek"

    body = _body_for("moonshot", tmp_path, prompt_cache=True)
    assert body["reasoning_effort"] == "high"
    assert body["prompt_cache_options"] == {"mode": "implicit", "ttl": "5m"}

    body = _body_for("openai", tmp_path)
    assert body["max_completion_tokens"] == 50 and "max_tokens" not in body
    assert body["reasoning_effort"] == "medium"

    body = _body_for("openai", tmp_path, reasoning=False)
    assert "reasoning_effort" not in body


def test_history_carries_reasoning_and_tool_calls(tmp_path: Path) -> None:
    with FakeUpstream(vllm) as up, front(tmp_path, config(up.url, dialect="vllm")) as f:
        # reasoning_content is a Kimi field of the assistant turn: the SDK's message types lack it.
        history: list[Any] = [
            {"role": "user", "content": "Weather?"},
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": "Look it up.",
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "w", "arguments": "{}"}}],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        ]
        f.sdk.chat.completions.create(model="kimi-k3.1-pro", max_completion_tokens=50, messages=history)
        sent = up.bodies[0]["messages"]
    assert sent[1]["reasoning_content"] == "Look it up."
    assert sent[1]["tool_calls"][0]["function"] == {"name": "w", "arguments": "{}"}
    assert sent[2] == {"role": "tool", "content": "sunny", "tool_call_id": "c1"}


def test_missing_capabilities_are_a_clean_400(tmp_path: Path) -> None:
    caps = {"tools": False, "json_schema": False, "vision": False}
    with FakeUpstream(vllm) as up, front(tmp_path, config(up.url, dialect="vllm", capabilities=caps)) as f:
        r = f.http.post("/v1/chat/completions", json={"model": "kimi-k3.1-pro", "messages": MESSAGES, "tools": TOOLS})
        assert r.status_code == 400 and r.json()["error"]["param"] == "tools"
        assert "tool support" in r.json()["error"]["message"]
        fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
        r = f.http.post(
            "/v1/chat/completions", json={"model": "kimi-k3.1-pro", "messages": MESSAGES, "response_format": fmt}
        )
        assert r.status_code == 400 and r.json()["error"]["param"] == "response_format"
        picture = {"type": "image_url", "image_url": {"url": data_url("image/png", image("PNG"))}}
        r = f.http.post(
            "/v1/chat/completions",
            json={"model": "kimi-k3.1-pro", "messages": [{"role": "user", "content": [picture]}]},
        )
        assert r.status_code == 400 and "cannot see images" in r.json()["error"]["message"]
        assert up.bodies == []  # nothing left for the upstream


MEDIA = [
    ("image_url", "image/png", lambda: image("PNG")),
    ("image_url", "image/jpeg", lambda: image("JPEG")),
    ("image_url", "image/webp", lambda: image("WEBP")),
    ("video_url", "video/mp4", lambda: mp4(seconds=0.5)),
]


@pytest.mark.parametrize(("part", "mime", "make"), MEDIA, ids=[m[1] for m in MEDIA])
def test_vision_route_sends_media_intact(tmp_path: Path, part: str, mime: str, make: Any) -> None:
    """Checked media reach a vision-capable upstream byte for byte, in the part they came in."""
    url = data_url(mime, make())
    with FakeUpstream(vllm) as up, front(tmp_path, config(up.url, dialect="vllm", capabilities={"vision": True})) as f:
        r = f.http.post(
            "/v1/chat/completions",
            json={
                "model": "kimi-k3.1-pro",
                "max_tokens": 50,
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "What?"}, {"type": part, part: {"url": url}}]}
                ],
            },
        )
        assert r.status_code == 200, r.text
        parts = up.bodies[0]["messages"][0]["content"]
    assert parts == [{"type": "text", "text": "What?"}, {"type": part, part: {"url": url}}]


async def ignores_stream(body: dict[str, Any], c: Conn) -> None:
    """An OpenAI-compatible server that answers stream=true with one whole JSON completion."""
    message: dict[str, Any] = {"role": "assistant", "content": ANSWER, "reasoning_content": REASONING}
    await c.json(
        200,
        {
            "id": "x",
            "object": "chat.completion",
            "created": 1,
            "model": "m",
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": _usage(),
        },
    )


def test_an_upstream_that_ignores_stream_still_streams_to_the_client(tmp_path: Path) -> None:
    with FakeUpstream(ignores_stream) as up, front(tmp_path, config(up.url, dialect="openai")) as f:
        stream = list(
            f.sdk.chat.completions.create(
                model="kimi-k3.1-pro", messages=MESSAGES, max_completion_tokens=50, stream=True
            )
        )
        content = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert content == ANSWER
        assert [c.choices[0].finish_reason for c in stream if c.choices][-1] == "stop"


async def searching(body: dict[str, Any], c: Conn) -> None:
    """An engine that asks for a web search by calling the tool it was given."""
    await c.head()
    await c.event(chunk({"role": "assistant", "content": ""}))
    await c.event(
        chunk(
            {
                "tool_calls": [
                    {
                        "id": "call-ws",
                        "type": "function",
                        "index": 0,
                        "function": {"name": "$web_search", "arguments": '{"query": "x"}'},
                    }
                ]
            }
        )
    )
    await c.event(chunk({}, "tool_calls"))
    await c.event({**chunk({}), "choices": [], "usage": _usage()})
    await c.done()


@pytest.mark.parametrize("dialect", ["vllm", "moonshot"])
def test_web_search_reaches_an_upstream_and_comes_back_as_a_builtin_call(tmp_path: Path, dialect: str) -> None:
    with FakeUpstream(searching) as up, front(tmp_path, config(up.url, dialect=dialect)) as f:
        r = f.http.post(
            "/v1/chat/completions",
            json={"model": "kimi-k3.1-pro", "messages": MESSAGES, "tools": [{"type": "web_search"}]},
        )
        assert r.status_code == 200, r.text
        [call] = r.json()["choices"][0]["message"]["tool_calls"]
        sent = up.bodies[0]["tools"]
    assert call["type"] == "builtin_function" and call["function"]["name"] == "$web_search"
    # Every engine gets a function with a query to fill in; kimi-server runs the search itself.
    assert sent[0]["type"] == "function" and sent[0]["function"]["name"] == "$web_search"
    assert "query" in sent[0]["function"]["parameters"]["properties"]
