"""SGLang (``--reasoning-parser kimi_k2 --tool-call-parser kimi_k2``): ``separate_reasoning``
puts the thinking in ``reasoning_content``; the template's ``thinking`` kwarg switches it on."""

from __future__ import annotations

from typing import Any

from kimi_server.engines.upstream.dialects.base import THREE_LEVELS, Dialect, register


class SGLangDialect(Dialect):
    name = "sglang"

    def reasoning_controls(self, effort: str, native_reasoning: bool) -> dict[str, Any]:
        if not native_reasoning:
            return {}
        return {
            "separate_reasoning": True,
            "reasoning_effort": THREE_LEVELS[effort],
            "chat_template_kwargs": {"thinking": True, "reasoning_effort": effort},
        }

    def thinking_off(self) -> dict[str, Any]:
        return {"chat_template_kwargs": {"thinking": False}}


register(SGLangDialect())
