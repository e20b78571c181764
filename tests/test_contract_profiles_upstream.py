"""The moonshot contract's thinking switch on upstream routes: each dialect's own switch leaves
in the request, and reasoning an upstream streams anyway never reaches the client."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.test_upstream_dialects import MESSAGES, vllm
from tests.upstreams.fake import FakeUpstream
from tests.upstreams.front import config, front

OFF = {"thinking": {"type": "disabled"}}
SWITCHES: dict[str, dict[str, Any]] = {
    "moonshot": {"thinking": {"type": "disabled"}},
    "vllm": {"chat_template_kwargs": {"thinking": False}},
    "sglang": {"chat_template_kwargs": {"thinking": False}},
    "llamacpp": {"chat_template_kwargs": {"enable_thinking": False}},
    "openai": {},
}


@pytest.mark.parametrize("dialect", list(SWITCHES))
def test_thinking_disabled_reaches_the_upstream(dialect: str, tmp_path: Path) -> None:
    # The fake answers as vLLM does, reasoning included, whatever it was asked.
    with FakeUpstream(vllm) as up, front(tmp_path, config(up.url, dialect=dialect), contract="moonshot") as f:
        resp = f.sdk.chat.completions.create(
            model="kimi-k3", messages=MESSAGES, max_completion_tokens=50, extra_body=OFF
        )
        sent = up.bodies[0]
        for name, value in SWITCHES[dialect].items():
            assert sent[name] == value
        assert "reasoning_effort" not in sent and "reasoning_format" not in sent
        # kimi-k3's thinking temperature would be refused by Moonshot in this mode.
        assert "temperature" not in sent and "top_p" not in sent
        message = resp.choices[0].message
        assert "reasoning_content" not in (message.model_extra or {})
        assert message.content == "Hello there."

        f.sdk.chat.completions.create(model="kimi-k3", messages=MESSAGES, max_completion_tokens=50)
        assert up.bodies[1].get("temperature") == 1.0  # thinking on: the fixed value as before
        assert "thinking" not in up.bodies[1] or up.bodies[1]["thinking"] != OFF["thinking"]
