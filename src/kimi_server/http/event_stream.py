"""The SSE response of every generating door.

It sends its frames as they come, one body message each; when the client leaves it stops (the
connection's callback cancels it, ``http/disconnect.py``), closes the frames (which stops the
engine's call behind them) and gives the request's queue place back, however the stream ends.
While nothing is sent for ``interval`` seconds it sends a keep-alive frame (an SSE comment, or
the door's own ping), so clients and proxies know the answer is still coming; a failure that
escapes the frames becomes the door's failure frame rather than a cut connection.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from kimi_server.http.disconnect import ClientGone
from kimi_server.http.link import HttpLink

# No cache may hold a stream, and no proxy may buffer it (nginx reads X-Accel-Buffering).
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
COMMENT = b": keep-alive\n\n"


class EventStream(Response):
    media_type = "text/event-stream"

    def __init__(
        self,
        frames: AsyncIterator[bytes],
        *,
        link: HttpLink,
        failure: Callable[[BaseException], bytes],
        on_end: Callable[[], None],
        keep_alive: bytes = COMMENT,
        interval: float = 10.0,
    ) -> None:
        self.status_code = 200
        self.background = None
        self.init_headers(SSE_HEADERS)
        self._frames = frames
        self._link = link
        self._failure = failure
        self._on_end = on_end
        self._keep_alive = keep_alive
        self._interval = interval

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self._link.until_gone(self._send_all(send))
        except ClientGone:
            pass  # nobody reads the rest
        finally:
            try:
                close = getattr(self._frames, "aclose", None)
                if close is not None:
                    await close()
            finally:
                self._on_end()

    async def _send_all(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        beat = _KeepAlive(send, self._keep_alive, self._interval)
        try:
            try:
                async for chunk in self._frames:
                    beat.last = time.monotonic()
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except Exception as exc:
                await send({"type": "http.response.body", "body": self._failure(exc), "more_body": True})
        finally:
            await beat.stop()
        await send({"type": "http.response.body", "body": b"", "more_body": False})


class _KeepAlive:
    """Sends ``frame`` whenever nothing was sent for ``interval`` seconds. A timer checks, so the
    frames themselves only note the time they went out."""

    def __init__(self, send: Send, frame: bytes, interval: float) -> None:
        self._send = send
        self._frame = frame
        self._interval = interval
        self._loop = asyncio.get_running_loop()
        self._sending: asyncio.Task[None] | None = None
        self.last = time.monotonic()
        self._timer = self._loop.call_later(interval, self._check)

    def _check(self) -> None:
        idle = time.monotonic() - self.last
        if idle >= self._interval and self._sending is None:
            self.last = time.monotonic()
            self._sending = self._loop.create_task(self._beat())
            idle = 0.0
        self._timer = self._loop.call_later(max(self._interval - idle, 0.05), self._check)

    async def _beat(self) -> None:
        try:
            await self._send({"type": "http.response.body", "body": self._frame, "more_body": True})
        finally:
            self._sending = None

    async def stop(self) -> None:
        self._timer.cancel()
        sending = self._sending
        if sending is not None:
            await asyncio.gather(sending, return_exceptions=True)
