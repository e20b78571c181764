"""The lean client's pools (see ``wire``): one per upstream origin, at most ``max_connections``
connections, idle ones reused newest first and dropped after ``KEEPALIVE_EXPIRY``; a request
that finds every connection busy waits its turn (first come, first served) up to the pool
timeout. Also the request head built once per upstream, and whether a proxy applies (then
httpx serves the upstream, as before).
"""

from __future__ import annotations

import asyncio
import json
import ssl
import urllib.request
from collections import deque
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

from kimi_server import __version__
from kimi_server.engines.upstream.clients import KEEPALIVE_EXPIRY, tls_context
from kimi_server.engines.upstream.transport import (
    BrokenConnection,
    ConnectError,
    ConnectTimeout,
    PoolTimeout,
    TransportName,
)
from kimi_server.engines.upstream.wire import Connection, Response

# The head names this server; compression is not asked for (this client does not decode it).
USER_AGENT = f"kimi-server/{__version__}"


@dataclass(frozen=True, slots=True)
class Timeouts:
    connect: float
    read: float  # the longest wait for the next byte
    pool: float  # the longest wait for a free connection


def proxied(url: str) -> bool:
    """Whether httpx would send requests to ``url`` through a proxy (HTTP(S)_PROXY, ALL_PROXY,
    less NO_PROXY): such upstreams stay on httpx."""
    parts = urlsplit(url)
    proxies = urllib.request.getproxies()
    if parts.scheme not in proxies and "all" not in proxies:
        return False
    return not urllib.request.proxy_bypass(parts.hostname or "")


def request_head(url: str, headers: Mapping[str, str]) -> bytes:
    """``POST url`` and its headers, up to the Content-Length each request adds. ValueError
    for what this client does not send (userinfo, other schemes, header values that are not
    plain text): httpx serves those."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.username is not None:
        raise ValueError("not a plain http(s) URL")
    host = parts.hostname.encode("idna").decode("ascii")
    port = parts.port
    authority = f"[{host}]" if ":" in host else host
    if port is not None and port != (443 if parts.scheme == "https" else 80):
        authority += f":{port}"
    target = quote(parts.path or "/", safe="/%:@!$&'()*+,;=-._~")
    if parts.query:
        target += "?" + parts.query
    fields = {
        "Host": authority,
        "Accept": "*/*",
        "Accept-Encoding": "identity",
        "Connection": "keep-alive",
        "User-Agent": USER_AGENT,
        "Content-Type": "application/json",
        **headers,
    }
    lines = [f"POST {target} HTTP/1.1", *(f"{k}: {v}" for k, v in fields.items())]
    text = "\r\n".join(lines) + "\r\n"
    if any(c in v for v in fields.values() for c in "\r\n\0"):
        raise ValueError("a header value spans lines")
    return text.encode("ascii")  # UnicodeEncodeError is a ValueError


def encode_body(body: Any) -> bytes:
    """The JSON httpx's ``json=`` sends."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


class Pool:
    def __init__(self, url: str, max_connections: int, ssl_context: ssl.SSLContext | None = None) -> None:
        parts = urlsplit(url)
        self.host = (parts.hostname or "").encode("idna").decode("ascii")
        self.tls = parts.scheme == "https"
        self.port = parts.port or (443 if self.tls else 80)
        self.ssl_context = ssl_context
        self.max_connections = max(1, max_connections)
        self.idle: deque[Connection] = deque()  # oldest first
        self.count = 0  # connections open or opening
        self.waiters: deque[asyncio.Future[Connection | None]] = deque()
        self.loop: asyncio.AbstractEventLoop | None = None

    def post(self, head: bytes, body: bytes, timeouts: Timeouts) -> Exchange:
        """``async with pool.post(...) as resp``: the response once its head has arrived."""
        data = b"".join((head, b"Content-Length: ", str(len(body)).encode(), b"\r\n\r\n", body))
        return Exchange(self, data, timeouts)

    async def acquire(self, timeouts: Timeouts) -> tuple[Connection, bool]:
        """A connection and whether it was used before."""
        loop = asyncio.get_running_loop()
        if loop is not self.loop:
            self._bind(loop)
        idle = self.idle
        if idle:
            now = loop.time()
            while idle:
                conn = idle.pop()
                conn.idle = False
                if conn.expires > now and not conn.closed:
                    return conn, True
                conn.close()
        return await self._slot(loop, timeouts)

    async def fresh(self, timeouts: Timeouts) -> Connection:
        """A new connection, once a slot is free."""
        assert self.loop is not None
        conn, reused = await self._slot(self.loop, timeouts)
        if reused:  # handed over by an exchange that ended: its slot serves a new one
            conn.counted = False
            conn.close()
            conn = await self.open(self.loop, timeouts.connect)
        return conn

    async def _slot(self, loop: asyncio.AbstractEventLoop, timeouts: Timeouts) -> tuple[Connection, bool]:
        if self.count >= self.max_connections or self.waiters:
            got = await self._wait(loop, timeouts.pool)
            if got is not None:
                return got, True
        else:
            self.count += 1
        return await self.open(loop, timeouts.connect), False

    async def open(self, loop: asyncio.AbstractEventLoop, limit: float) -> Connection:
        """A new connection in a slot already reserved (counted) for it."""
        conn = Connection(self, loop)
        ctx: ssl.SSLContext | None = None
        if self.tls:
            ctx = self.ssl_context = self.ssl_context or tls_context()
        try:
            async with asyncio.timeout(limit):
                await loop.create_connection(
                    lambda: conn, self.host, self.port, ssl=ctx, server_hostname=self.host if ctx else None
                )
        except TimeoutError:
            conn.close()
            raise ConnectTimeout() from None
        except OSError as exc:
            conn.close()
            raise ConnectError(str(exc)) from None
        except BaseException:
            conn.close()
            raise
        return conn

    async def _wait(self, loop: asyncio.AbstractEventLoop, limit: float) -> Connection | None:
        """A connection handed over by one finishing, or None: a slot freed, open one."""
        fut: asyncio.Future[Connection | None] = loop.create_future()
        self.waiters.append(fut)
        try:
            async with asyncio.timeout(limit):
                return await fut
        except BaseException as exc:
            if fut.done() and not fut.cancelled():
                self._give_back(fut.result())  # handed over just as the wait ended
            else:
                fut.cancel()
                with suppress(ValueError):
                    self.waiters.remove(fut)
            if isinstance(exc, TimeoutError):
                raise PoolTimeout() from None
            raise

    def _give_back(self, got: Connection | None) -> None:
        if got is None:
            self.count -= 1
            self._slot_freed()
        else:
            self.put(got)

    def _slot_freed(self) -> None:
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                self.count += 1
                fut.set_result(None)
                return

    def put(self, conn: Connection) -> None:
        """A connection whose exchange ended cleanly: to the next waiter, else idle."""
        if conn.loop is not self.loop:
            conn.close()  # a request begun on an event loop the pool has since left
            return
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                fut.set_result(conn)
                return
        now = conn.loop.time()
        conn.expires = now + KEEPALIVE_EXPIRY
        conn.idle = True
        idle = self.idle
        idle.append(conn)
        while idle[0].expires <= now:  # never the one just added
            stale = idle.popleft()
            stale.idle = False
            stale.close()

    def drop(self, conn: Connection) -> None:
        """Gives up a closed (or closing) connection's slot; once only."""
        if not conn.counted or conn.loop is not self.loop:
            return
        conn.counted = False
        if conn.idle:
            conn.idle = False
            with suppress(ValueError):
                self.idle.remove(conn)
        self.count -= 1
        self._slot_freed()

    def _bind(self, loop: asyncio.AbstractEventLoop) -> None:
        # Connections belong to one event loop; another (a new asyncio.run) starts afresh, and
        # the old loop, if it still runs, closes the connections left idle there.
        old, stale = self.loop, list(self.idle)
        self.loop = loop
        self.idle.clear()
        for conn in stale:
            conn.idle = False
            if old is not None and not old.is_closed():
                old.call_soon_threadsafe(conn.close)
        self.waiters.clear()
        self.count = 0

    def close(self) -> None:
        """Closes the idle connections; those in use close as their exchanges end."""
        while self.idle:
            conn = self.idle.pop()
            conn.idle = False
            conn.close()


class WireTransport:
    """The lean client as the relay's transport: the head built once, one pool per origin."""

    __slots__ = ("head", "pool", "timeouts")
    name: TransportName = "wire"

    def __init__(self, pool: Pool, head: bytes, timeouts: Timeouts) -> None:
        self.pool = pool
        self.head = head
        self.timeouts = timeouts

    def post(self, body: dict[str, Any]) -> Exchange:
        return self.pool.post(self.head, encode_body(body), self.timeouts)


class Exchange:
    """One request: sent on a pooled connection, and once more on a new one if a reused
    connection turns out to have been closed by the server before any of the answer came."""

    __slots__ = ("conn", "data", "pool", "timeouts")

    def __init__(self, pool: Pool, data: bytes, timeouts: Timeouts) -> None:
        self.pool = pool
        self.data = data
        self.timeouts = timeouts
        self.conn: Connection | None = None

    async def __aenter__(self) -> Response:
        pool = self.pool
        conn, reused = await pool.acquire(self.timeouts)
        while True:
            self.conn = conn
            resp = Response(conn)
            try:
                conn.send(resp, self.data, self.timeouts.read)
                await resp._head()
                return resp
            except BrokenConnection:
                if not reused or conn.got:
                    conn.done()
                    raise
            except BaseException:
                conn.done()
                raise
            # The server closed the idle connection meanwhile: its slot, if it still holds it,
            # passes to a new connection.
            slot, conn.counted = conn.counted, False
            conn.done()
            if slot:
                conn = await pool.open(conn.loop, self.timeouts.connect)
            else:
                conn = await pool.fresh(self.timeouts)
            reused = False

    async def __aexit__(self, *exc: object) -> None:
        if self.conn is not None:
            self.conn.done()
            self.conn = None
