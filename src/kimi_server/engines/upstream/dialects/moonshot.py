"""Moonshot's own Kimi API: the contract itself, so the catalogue's effort levels and cache
options go through unchanged and ``reasoning_content`` comes back as is."""

from __future__ import annotations

from typing import Any

from kimi_server.engines.upstream.dialects.base import Dialect, register
from kimi_server.engines.upstream.system_tools import SystemTools


class MoonshotDialect(Dialect):
    name = "moonshot"
    partial = "flag"
    system_tools = SystemTools.NATIVE

    def reasoning_controls(self, effort: str, native_reasoning: bool) -> dict[str, Any]:
        return {"reasoning_effort": effort}

    def thinking_off(self) -> dict[str, Any]:
        return {"thinking": {"type": "disabled"}}

    def extra(self, cache_ttl: str | None) -> dict[str, Any]:
        if cache_ttl is None:
            return {}
        return {"prompt_cache_options": {"mode": "implicit", "ttl": cache_ttl}}


register(MoonshotDialect())
