"""Tool calls, tool results and earlier reasoning render back into the next prompt, with the
chat templates of the real models (read from their GGUF files, which scripts/test pulls)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kimi_server.engines.llamacpp.gguf_meta import read_gguf_info
from kimi_server.engines.llamacpp.grammar import syntax_for_template
from kimi_server.engines.llamacpp.template import ChatTemplate
from kimi_server.engines.types import Message, ToolCallRecord, ToolSpec
from tests.conftest import model_path

QWEN = model_path("qwen2.5-coder-0.5b")
SMOL = model_path("smollm2-135m")
THINK = ("<think>\n", "\n</think>\n\n")
TOOLS = [ToolSpec("get_weather", "Weather.", {"type": "object", "properties": {}})]
CALLS = (
    ToolCallRecord("call_1", "get_weather", '{"city": "Rome"}'),
    ToolCallRecord("call_2", "get_weather", '{"city": "Oslo"}'),
)
HISTORY = [
    Message("user", "Weather in Rome and Oslo?"),
    Message("assistant", "", reasoning="Both cities need get_weather.", tool_calls=CALLS),
    Message("tool", '{"temp": 21}', tool_call_id="call_1"),
    Message("tool", '{"temp": 3}', tool_call_id="call_2"),
]


def template(path: Path) -> ChatTemplate:
    assert path.exists(), f"{path.name} is not pulled (scripts/test pulls it)"
    info = read_gguf_info(path)
    return ChatTemplate(info.chat_template, bos_token=info.bos_token, eos_token=info.eos_token)


def generated_turn(t: ChatTemplate) -> str:
    """What the engine generates for the assistant turn above: reasoning, then the calls in
    the grammar's call syntax."""
    syntax = syntax_for_template(t.source)
    calls = syntax.separator.join(
        f'{syntax.open}{{"name": "{c.name}", "arguments": {c.arguments}}}{syntax.close}' for c in CALLS
    )
    return f"{THINK[0]}Both cities need get_weather.{THINK[1]}{calls}"


@pytest.mark.parametrize("path", [QWEN, SMOL], ids=["qwen", "chatml"])
def test_history_renders_as_generated(path: Path) -> None:
    t = template(path)
    first = t.render(HISTORY[:1], tools=TOOLS, history_reasoning=THINK)
    prompt = t.render(HISTORY, tools=TOOLS, history_reasoning=THINK)
    # The earlier turn appears exactly as the model produced it, so the prompt cache holds.
    assert prompt.startswith(first + generated_turn(t)), prompt
    assert '{"temp": 21}' in prompt and '{"temp": 3}' in prompt
    assert prompt.index('{"temp": 21}') < prompt.index('{"temp": 3}')


def test_qwen_wraps_results_as_tool_responses() -> None:
    prompt = template(QWEN).render(HISTORY, tools=TOOLS, history_reasoning=THINK)
    assert '<tool_response>\n{"temp": 21}\n</tool_response>' in prompt
    assert "<tools>" in prompt and '"name": "get_weather"' in prompt


def test_custom_tool_is_described_with_its_patch_format() -> None:
    t = template(QWEN)
    prompt = t.render(HISTORY[:1], tools=[ToolSpec("apply_patch", "Edit files.", kind="custom")])
    assert "apply_patch" in prompt and "*** Begin Patch" in prompt and "Edit files." in prompt


def test_system_message_tools_render_where_declared() -> None:
    """Qwen's own tool block (its "# Tools" section and call instructions) appears in the
    declaring system message's place, and only the request's own tools up front."""
    clock = ToolSpec("get_time", "Time.", {"type": "object", "properties": {}})
    turns = [
        Message("system", "Be brief."),
        Message("user", "Hi"),
        Message("system", "", tools=tuple(TOOLS)),
        Message("user", "Weather in Rome?"),
    ]
    prompt = template(QWEN).render(turns, tools=[clock, *TOOLS])
    head, _, rest = prompt.partition("<|im_start|>user\nHi<|im_end|>\n")
    assert '"get_time"' in head and '"get_weather"' not in head
    declared, _, tail = rest.partition("<|im_start|>user\nWeather in Rome?")
    assert declared.startswith("<|im_start|>system\n# Tools\n") and '"get_weather"' in declared
    assert "<tool_call>" in declared and '"get_time"' not in declared + tail


def test_system_message_tools_without_a_native_tool_block() -> None:
    turns = [Message("user", "Hi"), Message("system", "", tools=tuple(TOOLS)), Message("user", "Rome?")]
    prompt = template(SMOL).render(turns, tools=TOOLS)
    first, _, rest = prompt.partition("<|im_start|>user\nHi<|im_end|>\n")
    assert '"get_weather"' not in first
    assert rest.startswith("<|im_start|>system\nYou can call these tools.") and '"get_weather"' in rest
