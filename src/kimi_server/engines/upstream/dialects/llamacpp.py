"""llama.cpp's ``llama-server`` (``--jinja``): ``reasoning_format: deepseek`` returns thinking in
``reasoning_content``; ``enable_thinking`` is the template switch most thinking models read.

Its ``tool_choice: "required"`` constrains nothing for many templates (the answer is free text
that may never end), while its ``response_format`` JSON Schema is always a grammar: forced calls
go through that."""

from __future__ import annotations

from typing import Any

from kimi_server.engines.upstream.dialects.base import Dialect, register


class LlamaCppDialect(Dialect):
    name = "llamacpp"
    partial = "prefill"
    forced_tool_calls = "json_schema"

    def reasoning_controls(self, effort: str, native_reasoning: bool) -> dict[str, Any]:
        if not native_reasoning:
            return {}
        return {
            "reasoning_format": "deepseek",
            "chat_template_kwargs": {"enable_thinking": True, "reasoning_effort": effort},
        }

    def thinking_off(self) -> dict[str, Any]:
        return {"chat_template_kwargs": {"enable_thinking": False}}


register(LlamaCppDialect())
