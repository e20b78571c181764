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
        buffer: list[bytes] = []
        size = 0
        streaming = False
        flusher: asyncio.Task[None] | None = None

        async def flush() -> None:
            nonlocal size
            while buffer:
                data = b"".join(buffer)
                buffer.clear()
                size = 0
                await send({"type": "http.response.body", "body": data, "more_body": True})

        async def coalescing_send(message: Message) -> None:
            nonlocal streaming, flusher, size
            if message["type"] == "http.response.start":
                ctype = dict(message.get("headers") or ()).get(b"content-type", b"")
                streaming = ctype.startswith(b"text/event-stream")
                await send(message)
                return
            if not streaming or message["type"] != "http.response.body":
                await send(message)
                return
            if flusher is not None and flusher.done():
                done, flusher = flusher, None
                done.result()  # a failed write surfaces here, in the producer
            if message.get("more_body", False):
                buffer.append(message.get("body", b""))
                size += len(buffer[-1])
                if flusher is None:
                    flusher = asyncio.get_running_loop().create_task(flush())
                if size > self.max_bytes:
                    await flusher
                return
            if flusher is not None:
                await flusher
            await flush()
            await send(message)

        try:
            await self.app(scope, receive, coalescing_send)
        finally:
            if flusher is not None and not flusher.done():
                flusher.cancel()
                with contextlib.suppress(BaseException):
                    await flusher
