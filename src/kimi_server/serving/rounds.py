"""Metering for a request that calls the engine several times (the server-side web-search
rounds): one ledger row, written before the terminal event, with the searches it ran."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Container
from contextlib import aclosing
from typing import TypeVar

from kimi_server.engines.base import AsyncStream, Engine
from kimi_server.gate.metering import MeteredEngine

E = TypeVar("E")


class Rounds:
    def __init__(self, engine: Engine, searches: Callable[[], int]) -> None:
        self._metered = engine if isinstance(engine, MeteredEngine) else None
        self._searches = searches
        if self._metered is not None:
            self._metered.deferred = True

    async def commit(self) -> None:
        if self._metered is not None:
            await self._metered.commit(self._searches())

    def abandon(self) -> None:
        if self._metered is not None:
            self._metered.abandon(self._searches())

    async def events(self, events: AsyncStream[E], is_terminal: Callable[[E], bool]) -> AsyncGenerator[E, None]:
        """``events`` passed on; the row is committed just before the terminal one."""
        try:
            async with aclosing(events):
                async for event in events:
                    if is_terminal(event):
                        await self.commit()
                    yield event
        finally:
            self.abandon()


def terminal_type(names: Container[str]) -> Callable[[dict[str, object]], bool]:
    """A terminal test for events that carry their name under ``type``."""
    return lambda event: event.get("type") in names
