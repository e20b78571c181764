"""The engine contract every backend implements."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from kimi_server.engines.types import EngineEvent, GenerationRequest


class Engine(Protocol):
    """Yields events for one request; closing the iterator early cancels the generation."""

    name: str

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    def generate(self, request: GenerationRequest) -> AsyncIterator[EngineEvent]: ...

    def accepts_images(self) -> bool: ...

    def context_length(self) -> int | None:
        """Tokens one request may hold, prompt and output together (issue 8); None: unknown
        (an upstream whose window is not configured)."""
        ...

    def concurrency(self) -> int | None:
        """Requests it serves at once: the slots of its admission queue, beyond which requests
        wait their turn (issue 12); None: the server's ``parallel``."""
        ...

    def tenant_stats(self, key_id: str) -> dict[str, int]:
        """One API key's own ``active_calls`` and ``cancelled_calls`` (what that tenant may see)."""
        ...

    def stats(self) -> dict[str, int]:
        """Counters for operators: calls in flight, calls cancelled by a departed client."""
        ...
