"""The engine contract every backend implements."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Awaitable
from typing import Protocol, TypeVar, runtime_checkable

from kimi_server.engines.types import EngineEvent, GenerationRequest

T_co = TypeVar("T_co", covariant=True)


class AsyncStream(Protocol[T_co]):
    """An async iterator its reader must close when it stops early (an async generator, or a
    wrapper around one): closing it stops the work behind it, the engine's slot included."""

    def __aiter__(self) -> AsyncIterator[T_co]: ...

    def __anext__(self) -> Awaitable[T_co]: ...

    def aclose(self) -> Awaitable[None]: ...


class Engine(Protocol):
    """Yields events for one request; closing the iterator early cancels the generation."""

    name: str

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    def generate(self, request: GenerationRequest) -> AsyncGenerator[EngineEvent, None]: ...

    def accepts_images(self) -> bool: ...

    def context_length(self) -> int | None:
        """Tokens one request may hold, prompt and output together; None: unknown
        (an upstream whose window is not configured)."""
        ...

    def concurrency(self) -> int | None:
        """Requests it serves at once: the slots of its admission queue, beyond which requests
        wait their turn; None: the server's ``parallel``."""
        ...

    def tenant_stats(self, key_id: str) -> dict[str, int]:
        """One API key's own ``active_calls`` and ``cancelled_calls`` (what that tenant may see)."""
        ...

    def stats(self) -> dict[str, int]:
        """Counters for operators: calls in flight, calls cancelled by a departed client."""
        ...


@runtime_checkable
class PromptAsker(Protocol):
    """An engine that can count a request's prompt only by asking the server behind it (an
    upstream's tokenize endpoint): a round trip too many for every admission, but what a client
    asking for the count (token estimation, ``count_tokens``) should get."""

    async def ask_prompt_tokens(self, request: GenerationRequest) -> int | None:
        """The prompt's tokens by the serving model's own tokenizer; None: cannot tell."""
        ...

    def counts_exactly(self) -> bool:
        """Whether a text prompt's count is the serving engine's own figure (what it bills)."""
        ...


@runtime_checkable
class PromptCounter(Protocol):
    """An engine that can tell a request's prompt tokens before it runs (the embedded engine,
    with the model's own tokenizer). Engines without it are sized by characters only."""

    async def count_prompt_tokens(self, request: GenerationRequest) -> int | None:
        """The prompt's tokens as the model will see them (rendered), or an upper bound where
        the tokenizer is not known exactly; None: cannot tell."""
        ...

    def prompt_token_limit(self) -> int | None:
        """The most prompt tokens one request may bring (an operator's bound, below the
        window); None: only the window bounds it."""
        ...

    def counts_exactly(self) -> bool:
        """Whether a text prompt's count is the engine's own figure (what it bills), not a bound."""
        ...
