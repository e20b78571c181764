"""vLLM's OpenAI server (``vllm serve ... --reasoning-parser kimi_k2 --tool-call-parser kimi_k2``).

Thinking is switched by the chat template's ``thinking`` kwarg; ``reasoning_effort`` is passed
through to the template too. vLLM answers with ``reasoning`` (older: ``reasoning_content``)."""

from __future__ import annotations

from typing import Any

from kimi_server.engines.upstream.dialects.base import THREE_LEVELS, Dialect, register
from kimi_server.engines.upstream.system_tools import SystemTools


class VLLMDialect(Dialect):
    name = "vllm"
    partial = "continue"
    system_tools = SystemTools.MIRRORED

    def reasoning_controls(self, effort: str, native_reasoning: bool) -> dict[str, Any]:
        if not native_reasoning:
            return {}
        return {
            "reasoning_effort": THREE_LEVELS[effort],
            "chat_template_kwargs": {"thinking": True, "reasoning_effort": effort},
            "include_reasoning": True,
        }

    def thinking_off(self) -> dict[str, Any]:
        return {"chat_template_kwargs": {"thinking": False}}


register(VLLMDialect())
