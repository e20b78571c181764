"""What differs between upstream servers that all speak Chat Completions: how the request asks
for reasoning at a given effort, and a few field names. Each dialect is one small module."""

from __future__ import annotations

from typing import Any, Literal

from kimi_server.engines.upstream.system_tools import SystemTools

# The catalogue's levels (low/high/max) in the three-level vocabulary most engines accept.
THREE_LEVELS = {"low": "low", "high": "medium", "max": "high"}


class Dialect:
    name = "openai"
    max_tokens_field = "max_tokens"
    # Whether assistant turns may carry ``reasoning_content`` back to the upstream.
    reasoning_history = True
    # How tools declared in a system message reach the upstream (upstream/system_tools.py).
    system_tools = SystemTools.LIFTED
    # How tool_choice "required" / a named function is kept (engines/upstream/forced_calls.py):
    # the engine constrains the call itself, or answers JSON under a schema read back as a call.
    forced_tool_calls: Literal["native", "json_schema", "none"] = "native"
    # Partial Mode (engines/upstream/partial.py): how the answer's prefix reaches the engine:
    # Moonshot's ``partial`` flag on the last assistant message, vLLM's
    # ``continue_final_message``, a final assistant message the engine continues (llama.cpp's
    # server prefill), or not at all (a 400 before anything is sent).
    partial: Literal["flag", "continue", "prefill", "none"] = "none"

    def reasoning_controls(self, effort: str, native_reasoning: bool) -> dict[str, Any]:
        """Body fields that ask for reasoning at ``effort`` (one of the catalogue's levels)."""
        return {}

    def thinking_off(self) -> dict[str, Any]:
        """Body fields that switch the upstream's reasoning off (a client's ``thinking``
        disabled); none where the engine has no such switch (its reasoning is then dropped)."""
        return {}

    def extra(self, cache_ttl: str | None) -> dict[str, Any]:
        """Any other fields; ``cache_ttl`` is set when the route's upstream keeps its own cache."""
        return {}


REGISTRY: dict[str, Dialect] = {}


def register(dialect: Dialect) -> Dialect:
    REGISTRY[dialect.name] = dialect
    return dialect
