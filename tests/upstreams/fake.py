"""A fake upstream on a real socket: a small asyncio HTTP/1.1 server in its own thread.

Each scenario is an async handler that writes exactly the bytes a real engine (or a broken
one) would: SSE chunks, error bodies, stalls, resets. One request per connection
(``Connection: close``), so a stream may end at any byte, like a truncated one does.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import Any


class Conn:
    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer

    async def head(self, status: int = 200, ctype: str = "text/event-stream", **headers: str) -> None:
        lines = [f"HTTP/1.1 {status} X", f"Content-Type: {ctype}", "Connection: close"]
        lines += [f"{k.replace('_', '-')}: {v}" for k, v in headers.items()]
        self.writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        await self.writer.drain()

    async def raw(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def event(self, obj: Any) -> None:
        await self.raw(b"data: " + json.dumps(obj).encode() + b"\n\n")

    async def done(self) -> None:
        await self.raw(b"data: [DONE]\n\n")

    async def json(self, status: int, obj: Any, **headers: str) -> None:
        body = json.dumps(obj).encode()
        await self.head(status, "application/json", Content_Length=str(len(body)), **headers)
        await self.raw(body)

    def reset(self) -> None:
        self.writer.transport.abort()


Handler = Callable[[dict[str, Any], Conn], Awaitable[None]]


class FakeUpstream:
    def __init__(self, handler: Handler, routes: Mapping[str, Handler] | None = None) -> None:
        self.handler = handler
        # Other paths (a tokenize endpoint, say; /v1/models too, in place of its one model "m"):
        # their requests go to ``routed``, not ``bodies``.
        self.routes = routes or {}
        self.bodies: list[dict[str, Any]] = []
        self.routed: list[tuple[str, dict[str, Any]]] = []
        self.disconnects = 0  # handlers that saw the client go away
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.base_events.Server | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> FakeUpstream:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._serve, "127.0.0.1", 0), self._loop
        ).result()
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def __exit__(self, *_: object) -> None:
        async def stop() -> None:
            assert self._server is not None
            self._server.close()
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        if not self._thread.is_alive():
            self._loop.close()  # its sockets with it, not left to the garbage collector

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            request_line, *header_lines = head.decode().split("\r\n")
            headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines if h)}
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            conn = Conn(writer)
            path = request_line.split()[1]
            parsed = _parsed(body)
            if path.endswith("/models") and path not in self.routes:
                await conn.json(200, {"object": "list", "data": [{"id": "m", "object": "model"}]})
                return
            if path in self.routes:
                self.routed.append((path, parsed))
                await self.routes[path](parsed, conn)
                return
            self.bodies.append(parsed)
            await self.handler(parsed, conn)
        except (ConnectionError, asyncio.IncompleteReadError):
            self.disconnects += 1
        finally:
            self._tasks.discard(task)
            if not writer.transport.is_closing():
                writer.close()


def _parsed(body: bytes) -> dict[str, Any]:
    """The request's JSON; a body that is none (a client testing malformed JSON) reaches the
    handler as ``{}``, so a scenario answers it as it answers anything."""
    try:
        value = json.loads(body) if body else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-up",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "upstream-model",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish, **extra}],
    }
