"""The client's disconnect, for work that must stop when nobody waits for its answer.

``until_disconnected`` runs a non-streaming generation (or a wait in the queue) and stops it
when the client leaves. Under this server's own HTTP protocol (``http/connections.py``) the
connection tells the request when it is lost (``DisconnectWatch`` in the scope), so the work
runs in the request's own task and is cancelled from that callback: no watcher task per
request. Elsewhere (an in-process test client, another server) a watcher task waits for the
ASGI ``http.disconnect`` message instead.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from fastapi import Request

from kimi_server.errors import APIError

T = TypeVar("T")
DISCONNECT = "kimi.disconnect"  # scope key: the request's DisconnectWatch


class DisconnectWatch:
    """What runs when the request's connection is lost; set by the HTTP protocol."""

    __slots__ = ("callbacks", "lost")

    def __init__(self) -> None:
        self.callbacks: list[Callable[[], object]] = []
        self.lost = False

    def fire(self) -> None:
        self.lost = True
        callbacks, self.callbacks = self.callbacks, []
        for callback in callbacks:
            callback()


class ClientGone(APIError):
    """The client left before the answer was ready; nobody reads this response."""

    status_code = 499
    error_type = "invalid_request_error"
    default_code = "client_closed_request"

    def __init__(self) -> None:
        super().__init__("The client closed the request.")


async def until_disconnected(request: Request, work: Awaitable[T], discard: Callable[[T], object] | None = None) -> T:
    """Awaits ``work``; if the client disconnects first, cancels it (which stops the engine's
    slot at its next token) and raises ``ClientGone``. ``discard`` gets a result that arrived
    anyway (a cancellation can lose the race with a result that was already set)."""
    watch: DisconnectWatch | None = request.scope.get(DISCONNECT)
    if watch is not None and discard is None and asyncio.iscoroutine(work):
        return await _in_this_task(watch, work)
    return await _with_watcher(request, work, discard)


async def _in_this_task(watch: DisconnectWatch, work: Coroutine[Any, Any, T]) -> T:
    if watch.lost:
        work.close()
        raise ClientGone
    task = asyncio.current_task()
    assert task is not None
    cancel = task.cancel
    watch.callbacks.append(cancel)
    try:
        return await work
    except asyncio.CancelledError:
        # Ours only if nobody else asked for the cancellation too (a server shutting down).
        if watch.lost and task.uncancel() == 0:
            raise ClientGone from None
        raise
    finally:
        with contextlib.suppress(ValueError):
            watch.callbacks.remove(cancel)


async def _with_watcher(request: Request, work: Awaitable[T], discard: Callable[[T], object] | None) -> T:
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        if discard is not None and not task.cancelled() and task.exception() is None:
            discard(task.result())
        raise ClientGone
    finally:
        watcher.cancel()
        task.cancel()


async def _disconnected(request: Request) -> None:
    # The body was read before the route ran, so the next message is the disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass
