"""Joins SSE writes that become ready in the same event-loop turn into one socket write.

A relayed upstream delivers several events per network read; written one by one they cost one
system call each, which on a busy machine is most of the relay's cost. Here each streamed body
part is buffered and a flush is scheduled for when the producer next waits (for the network,
or the model): nothing waits on a timer, so no latency is added, and a slow producer still
gets one write per event. The buffer is bounded: past ``max_bytes`` the producer waits for the
flush, so the client's pace still limits the stream.
"""

from __future__ import annotations

import asyncio
import contextlib

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class CoalesceStreams:
    def __init__(self, app: ASGIApp, max_bytes: int = 65536) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        batch = _Batch(send, self.max_bytes)
        try:
            await self.app(scope, receive, batch.send)
        finally:
            await batch.stop()


class _Batch:
    """One response's writes: passed on as they come, except a stream's body parts, which are
    joined while the producer keeps producing."""

    def __init__(self, send: Send, max_bytes: int) -> None:
        self._send = send
        self.max_bytes = max_bytes
        self.buffer: list[bytes] = []
        self.size = 0
        self.streaming = False
        self.flusher: asyncio.Task[None] | None = None

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            ctype = dict(message.get("headers") or ()).get(b"content-type", b"")
            self.streaming = ctype.startswith(b"text/event-stream")
            await self._send(message)
            return
        if not self.streaming or message["type"] != "http.response.body":
            await self._send(message)
            return
        flusher = self.flusher
        if flusher is not None and flusher.done():
            self.flusher = None
            flusher.result()  # a failed write surfaces here, in the producer
        if message.get("more_body", False):
            await self._hold(message.get("body", b""))
            return
        if self.flusher is not None:
            await self.flusher
        await self._flush()
        await self._send(message)

    async def _hold(self, body: bytes) -> None:
        self.buffer.append(body)
        self.size += len(body)
        if self.flusher is None:
            self.flusher = asyncio.get_running_loop().create_task(self._flush())
        if self.size > self.max_bytes:
            await self.flusher

    async def _flush(self) -> None:
        while self.buffer:
            data = b"".join(self.buffer)
            self.buffer.clear()
            self.size = 0
            await self._send({"type": "http.response.body", "body": data, "more_body": True})

    async def stop(self) -> None:
        flusher = self.flusher
        if flusher is not None and not flusher.done():
            flusher.cancel()
            with contextlib.suppress(BaseException):
                await flusher
