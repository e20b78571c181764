"""One API request sent through this server's own application, in process, streamed back.

The playground's requests take the same path as any client's (the guard, limits, ledger,
request log), with the signed-in key as their bearer token, without the key ever reaching
the browser and without a connection to the server's own port (which may be a Unix socket,
or behind a proxy).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Scope

_END: Message = {"type": "kimi.console.end"}
_running: set[asyncio.Task[None]] = set()  # inner requests winding down after their reader left


@dataclass
class Forwarded:
    status: int
    content_type: str
    body: AsyncIterator[bytes]

    async def read(self) -> bytes:
        """The whole body (for short answers: JSON objects, errors)."""
        return b"".join([piece async for piece in self.body])


@dataclass(frozen=True)
class Streamed:
    """A body handed to the inner request piece by piece (an upload, never held whole), with
    its content type and its length, declared up front as a client would."""

    content_type: str
    length: int
    pieces: AsyncIterator[bytes]


async def forward(
    app: ASGIApp, outer: Scope, path: str, key: str, body: bytes | Streamed = b"", *, method: str = "POST"
) -> Forwarded:
    """Sends ``body`` (JSON, or a ``Streamed`` one) to ``path`` with ``key``; returns once the
    response has begun."""
    queue: asyncio.Queue[Message] = asyncio.Queue()
    gone = asyncio.Event()
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            if isinstance(body, bytes):
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            piece = await anext(body.pieces, None)
            if piece is not None:
                return {"type": "http.request", "body": piece, "more_body": True}
            sent = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        await queue.put(message)

    scope = _inner_scope(outer, method, path, key, body)

    async def run() -> None:
        try:
            await app(scope, receive, send)
        finally:
            queue.put_nowait(_END)

    task = asyncio.get_running_loop().create_task(run())
    start = await queue.get()
    if start["type"] != "http.response.start":
        gone.set()
        await asyncio.gather(task, return_exceptions=True)
        raise RuntimeError("the API answered without a response")
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in start.get("headers", [])}
    return Forwarded(int(start["status"]), headers.get("content-type", "application/json"), _chunks(queue, gone, task))


def _inner_scope(outer: Scope, method: str, path: str, key: str, body: bytes | Streamed) -> Scope:
    """The inner request's scope: bearing ``key``, from the outer request's client."""
    if isinstance(body, bytes):
        content_type, length = "application/json", len(body)
    else:
        content_type, length = body.content_type, body.length
    scope: Scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": outer.get("scheme", "http"),
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "client": outer.get("client"),
        "server": outer.get("server"),
        "headers": [
            (b"authorization", f"Bearer {key}".encode()),
            (b"content-type", content_type.encode("latin-1")),
            (b"content-length", str(length).encode()),
            (b"accept", b"text/event-stream, application/json"),
        ],
    }
    if "state" in outer:
        scope["state"] = dict(outer["state"])
    return scope


async def _chunks(queue: asyncio.Queue[Message], gone: asyncio.Event, task: asyncio.Task[None]) -> AsyncIterator[bytes]:
    """The response body's pieces as ``task`` (the inner request) sends them to ``queue``."""
    try:
        while True:
            message = await queue.get()
            if message["type"] != "http.response.body":
                return
            if message.get("body"):
                yield message["body"]
            if not message.get("more_body", False):
                return
    finally:
        # The browser left (or the answer ended): the inner request sees its client go,
        # which stops the generation at its next token.
        gone.set()
        _running.add(task)
        task.add_done_callback(_running.discard)
