"""Any OpenAI-compatible API: ``reasoning_effort`` (low/medium/high) for reasoning models only,
``max_completion_tokens``, and no reasoning text in the history (OpenAI rejects it)."""

from __future__ import annotations

from typing import Any

from kimi_server.engines.upstream.dialects.base import THREE_LEVELS, Dialect, register


class OpenAIDialect(Dialect):
    name = "openai"
    max_tokens_field = "max_completion_tokens"
    reasoning_history = False

    def reasoning_controls(self, effort: str, native_reasoning: bool) -> dict[str, Any]:
        return {"reasoning_effort": THREE_LEVELS[effort]} if native_reasoning else {}


register(OpenAIDialect())
