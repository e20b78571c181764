"""A lean HTTP/1.1 client for the relay's one hot call: POST JSON to ``{base}/chat/completions``
and stream the answer back as it arrives.

httpx spends about a quarter of the relay's CPU per request at 64 in flight: parsing URLs (with
``ipaddress``), building a Request, its pool's scans over every connection, h11. This call needs
none of it: the request head is built once per upstream, each request is a single write, the
response is parsed by httptools (llhttp, in C) straight into a small Response, and the read
timeout is one timer per request re-armed lazily rather than a timeout per read. Proxies,
health checks and the other one-off calls stay on httpx. Pools, connection setup and the
transport this client is to the relay (``transport``) are in ``wire_pool``.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import httptools

from kimi_server.engines.upstream.transport import BrokenConnection, ReadTimeout, TransportError

if TYPE_CHECKING:
    from kimi_server.engines.upstream.wire_pool import Pool

# Unread body bytes beyond which the socket stops being read until the consumer catches up.
READ_HIGH = 256 * 1024


class Response:
    """One response: ``status`` and ``headers`` (lower-case names; repeated ones joined with
    ", ") once the head has arrived, then the body through ``async for`` or ``read()``."""

    __slots__ = ("_buffered", "_chunks", "_conn", "_ended", "_error", "_waiter", "headers", "status")

    def __init__(self, conn: Connection) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self._conn = conn
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._ended = False  # the whole body has arrived (it may not all be read yet)
        self._error: TransportError | None = None
        self._waiter: asyncio.Future[None] | None = None

    def __aiter__(self) -> Response:
        return self

    async def __anext__(self) -> bytes:
        # Written out, not through a helper coroutine: this runs for every chunk streamed.
        chunks = self._chunks
        while not chunks:
            if self._ended:
                raise StopAsyncIteration
            if self._error is not None:
                raise self._error
            conn = self._conn
            waiter = self._waiter = conn.loop.create_future()
            conn.last = conn.loop.time()  # the read timeout counts from each wait, as httpx's does
            await waiter
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._buffered = 0
        if self._conn.paused:
            self._conn.resume()
        return data

    async def read(self) -> bytes:
        parts = [part async for part in self]
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def drain(self, seconds: float) -> None:
        """Waits up to ``seconds`` for the body's end, so the connection may be kept; an error
        or a server that lingers only means the connection is closed instead."""
        if self._ended:
            return
        try:
            async with asyncio.timeout(seconds):
                async for _ in self:
                    pass
        except (TimeoutError, TransportError):
            pass

    async def _head(self) -> None:
        while not self.status:
            if self._error is not None:
                raise self._error
            conn = self._conn
            waiter = self._waiter = conn.loop.create_future()
            await waiter

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def _fail(self, error: TransportError) -> None:
        if self._error is None and not self._ended:
            self._error = error
            self._wake()


class Connection(asyncio.Protocol):
    """One keep-alive connection; httptools calls the ``on_*`` methods as it parses."""

    __slots__ = (
        "closed",
        "counted",
        "expires",
        "got",
        "idle",
        "keep",
        "last",
        "loop",
        "parser",
        "paused",
        "pool",
        "read_timeout",
        "resp",
        "timer",
        "transport",
        "until_eof",
    )

    def __init__(self, pool: Pool, loop: asyncio.AbstractEventLoop) -> None:
        self.pool = pool
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.resp: Response | None = None
        self.counted = True  # holds one of the pool's slots
        self.closed = False
        self.idle = False
        self.expires = 0.0
        self.paused = False
        self.keep = False
        self.until_eof = False  # a body with neither length nor chunks: it ends at EOF
        self.got = False  # any byte of the current response
        self.last = 0.0
        self.read_timeout = 0.0
        self.timer: asyncio.TimerHandle | None = None

    # --- the exchange

    def send(self, resp: Response, data: bytes, read_timeout: float) -> None:
        assert self.transport is not None
        self.resp = resp
        self.got = self.keep = self.until_eof = False
        self.read_timeout = read_timeout
        self.last = now = self.loop.time()
        if self.closed or self.transport.is_closing():
            resp._fail(BrokenConnection("the server closed the connection"))
            return
        self.transport.write(data)
        self.timer = self.loop.call_at(now + read_timeout, self._tick)

    def _tick(self) -> None:
        """The read timeout: fires once per ``read_timeout`` at most, re-armed from the last
        byte or wait, and only counts while the consumer is waiting for the server."""
        self.timer = None
        resp = self.resp
        if resp is None or resp._ended or resp._error is not None or self.closed:
            return
        now = self.loop.time()
        due = self.last + self.read_timeout
        if resp._waiter is None:
            due = now + self.read_timeout  # the consumer is busy; its next wait starts afresh
        elif due <= now:
            resp._fail(ReadTimeout())
            self.close()
            return
        self.timer = self.loop.call_at(due, self._tick)

    def done(self) -> None:
        """The exchange is over: back to the pool if the response ended and the connection
        may be kept, closed otherwise."""
        resp = self.resp
        self.resp = None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if resp is not None and resp._ended and resp._error is None and self.keep and not self.closed:
            if self.paused:
                self.resume()
            self.pool.put(self)
        else:
            self.close()

    def resume(self) -> None:
        self.paused = False
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.close()
        self.pool.drop(self)  # the slot frees now, not when the close completes

    # --- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)  # a stream connection's
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        resp = self.resp
        if resp is None or resp._ended:
            self.close()  # bytes nobody asked for: the connection cannot be trusted any more
            return
        self.got = True
        self.last = self.loop.time()
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade):
            resp._fail(BrokenConnection("malformed response"))
            self.close()

    def eof_received(self) -> bool:
        if self.resp is None:
            self.close()  # an idle connection the server gave up: out of the pool at once
        else:
            self._ended_by_eof()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self._ended_by_eof()
        self.pool.drop(self)

    def _ended_by_eof(self) -> None:
        resp = self.resp
        if resp is None or resp._ended:
            return
        if self.until_eof and resp.status:
            resp._ended = True
            resp._wake()
        else:
            resp._fail(BrokenConnection("the server closed the connection"))

    # --- httptools callbacks

    def on_message_begin(self) -> None:
        resp = self.resp
        if resp is None or resp._ended:
            # A second response to one request: feed_data fails, and the connection is closed.
            raise BrokenConnection("an unrequested response")

    def on_header(self, name: bytes, value: bytes) -> None:
        assert self.resp is not None
        headers = self.resp.headers
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text

    def on_headers_complete(self) -> None:
        resp = self.resp
        assert resp is not None
        status = self.parser.get_status_code()
        if status < 200:
            resp.headers = {}  # an interim response (100 Continue): the real one follows
            return
        resp.status = status
        headers = resp.headers
        self.keep = self.parser.should_keep_alive()
        self.until_eof = (
            status not in (204, 304)
            and "content-length" not in headers
            and "chunked" not in headers.get("transfer-encoding", "").lower()
        )
        resp._wake()

    def on_body(self, body: bytes) -> None:
        resp = self.resp
        assert resp is not None
        resp._chunks.append(body)
        resp._buffered += len(body)
        if resp._buffered > READ_HIGH and not self.paused:
            self.paused = True
            assert self.transport is not None
            self.transport.pause_reading()
        waiter = resp._waiter
        if waiter is not None:
            resp._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def on_message_complete(self) -> None:
        resp = self.resp
        assert resp is not None
        if not resp.status:
            return  # the end of an interim response
        resp._ended = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        resp._wake()
