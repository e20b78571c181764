"""An event stream whose first item was pulled before anything was sent, so that failures before
any output become plain HTTP errors rather than events inside a stream that already began."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from typing import Generic, TypeVar

from kimi_server.engines.base import AsyncStream

T = TypeVar("T")


async def prime(events: AsyncStream[T]) -> Primed[T]:
    """Pulls the first item now."""
    return Primed(await anext(events), events)


class Primed(Generic[T]):
    """The first item, then the rest straight from the source's own ``__anext__``: no
    generator of its own to resume for every streamed event."""

    def __init__(self, first: T, events: AsyncStream[T]) -> None:
        self._first: list[T] = [first]
        self._events = events

    def __aiter__(self) -> AsyncIterator[T]:
        return self

    def __anext__(self) -> Awaitable[T]:
        if self._first:
            return _ready(self._first.pop())
        return self._events.__anext__()

    async def aclose(self) -> None:
        self._first.clear()
        await self._events.aclose()


async def _ready(item: T) -> T:
    return item


class Pending(Generic[T]):
    """The first item still on its way (a task pulling it), then the rest from the source."""

    def __init__(self, first: asyncio.Task[T], events: AsyncStream[T]) -> None:
        self._first: asyncio.Task[T] | None = first
        self._events = events

    def __aiter__(self) -> AsyncIterator[T]:
        return self

    def __anext__(self) -> Awaitable[T]:
        first, self._first = self._first, None
        if first is not None:
            return first
        return self._events.__anext__()

    async def aclose(self) -> None:
        first, self._first = self._first, None
        if first is not None and not first.done():
            first.cancel()
            await asyncio.gather(first, return_exceptions=True)
        await self._events.aclose()


async def first_within(events: AsyncStream[T], grace: float) -> Primed[T] | Pending[T]:
    """The stream with its first item pulled, if it comes within ``grace`` seconds (its failure
    raised here); else the stream with that item still pending."""
    task = asyncio.ensure_future(_next(events))
    try:
        done, _ = await asyncio.wait({task}, timeout=grace)
    except BaseException:  # the caller was cancelled: its client left
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise
    if done:
        return Primed(task.result(), events)
    return Pending(task, events)


async def _next(events: AsyncStream[T]) -> T:
    return await anext(events)
