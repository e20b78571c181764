"""Text and media parts reach a vision upstream in the order the client wrote them, on every
dialect and from both endpoints: an image belongs to the words around it."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest

from kimi_server.settings import UpstreamCapabilities
from tests.media_samples import image, mp4
from tests.upstreams.fake import Conn, FakeUpstream, chunk
from tests.upstreams.front import config, front

DIALECTS = ["vllm", "sglang", "llamacpp", "moonshot", "openai"]
PNG = "data:image/png;base64," + base64.b64encode(image("PNG")).decode()
JPEG = "data:image/jpeg;base64," + base64.b64encode(image("JPEG")).decode()
MP4 = "data:video/mp4;base64," + base64.b64encode(mp4(seconds=0.5)).decode()


async def answer(body: dict[str, Any], c: Conn) -> None:
    await c.head()
    await c.event(chunk({"content": "Seen."}))
    await c.event(chunk({}, "stop"))
    await c.event({**chunk({}), "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 1}})
    await c.done()


def layout(content: Any) -> list[str]:
    """Each part as ``text:<words>`` or ``<part type>:<media type>``."""
    out = []
    for part in content:
        if part["type"] == "text":
            out.append(f"text:{part['text']}")
        else:
            url = part[part["type"]]["url"]
            out.append(f"{part['type']}:{url.split(';')[0].removeprefix('data:')}")
    return out


@pytest.mark.parametrize("dialect", DIALECTS)
def test_parts_keep_their_order_on_every_dialect(tmp_path: Path, dialect: str) -> None:
    caps = UpstreamCapabilities(vision=True)
    chat_content = [
        {"type": "text", "text": "first"},
        {"type": "image_url", "image_url": {"url": PNG}},
        {"type": "text", "text": "second"},
        {"type": "image_url", "image_url": {"url": JPEG}},
        {"type": "text", "text": "third"},
    ]
    responses_content = [
        {"type": "input_text", "text": "one"},
        {"type": "input_image", "image_url": JPEG},
        {"type": "input_text", "text": "two"},
        {"type": "input_image", "image_url": PNG},
        {"type": "input_text", "text": "three"},
    ]
    with FakeUpstream(answer) as up, front(tmp_path, config(up.url, dialect=dialect, capabilities=caps)) as f:
        chat = f.http.post(
            "/v1/chat/completions",
            json={
                "model": "kimi-k3.1-pro",
                "messages": [
                    {"role": "user", "content": chat_content},
                    {"role": "assistant", "content": "Noted."},
                    {
                        "role": "user",
                        "content": [
                            {"type": "video_url", "video_url": {"url": MP4}},
                            {"type": "text", "text": "what now?"},
                        ],
                    },
                ],
            },
        )
        responses = f.http.post(
            "/v1/responses",
            json={"model": "kimi-k3.1-pro", "input": [{"role": "user", "content": responses_content}]},
        )
    assert chat.status_code == 200, chat.text
    assert responses.status_code == 200, responses.text
    chat_body, responses_body = up.bodies
    first, _, video = chat_body["messages"]
    assert layout(first["content"]) == [
        "text:first",
        "image_url:image/png",
        "text:second",
        "image_url:image/jpeg",
        "text:third",
    ]
    assert layout(video["content"]) == ["video_url:video/mp4", "text:what now?"]
    [user] = [m for m in responses_body["messages"] if m["role"] == "user"]
    assert layout(user["content"]) == [
        "text:one",
        "image_url:image/jpeg",
        "text:two",
        "image_url:image/png",
        "text:three",
    ]


def test_media_first_then_words_is_sent_so(tmp_path: Path) -> None:
    caps = UpstreamCapabilities(vision=True)
    content = [{"type": "image_url", "image_url": {"url": PNG}}, {"type": "text", "text": "What is this?"}]
    with FakeUpstream(answer) as up, front(tmp_path, config(up.url, capabilities=caps)) as f:
        r = f.http.post(
            "/v1/chat/completions", json={"model": "kimi-k3.1-pro", "messages": [{"role": "user", "content": content}]}
        )
    assert r.status_code == 200, r.text
    assert layout(up.bodies[0]["messages"][0]["content"]) == ["image_url:image/png", "text:What is this?"]
