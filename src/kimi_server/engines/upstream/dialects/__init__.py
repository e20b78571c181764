"""Dialects by name; each module registers itself."""

from __future__ import annotations

from kimi_server.engines.upstream.dialects import llamacpp, moonshot, openai, sglang, vllm
from kimi_server.engines.upstream.dialects.base import REGISTRY, Dialect

__all__ = ["Dialect", "get_dialect", "llamacpp", "moonshot", "openai", "sglang", "vllm"]


def get_dialect(name: str) -> Dialect:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown upstream dialect {name!r}; known: {', '.join(sorted(REGISTRY))}") from None
