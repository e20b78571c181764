"""Connections to one upstream, spread over several small httpx pools; and httpx as the relay's
transport (``transport``) where the lean client does not serve an upstream.

One httpx pool checks every connection it holds on every request (idle, expired, readable), so
its CPU cost per request grows with its size: at 64 requests in flight one pool of 256 costs
about three times what sixteen pools of 16 cost together. Each request takes the pool with the
fewest requests in flight (round-robin on ties), so no pool waits for a connection while
another has room.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from functools import cache
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httpx

from kimi_server.engines.upstream.transport import (
    BrokenConnection,
    ConnectError,
    ConnectTimeout,
    PoolTimeout,
    ReadTimeout,
    TransportError,
    TransportName,
)

if TYPE_CHECKING:
    from kimi_server.engines.upstream.wire_pool import Pool

POOLS = 16
# Idle connections are dropped before the common 5 s server keep-alive ends (uvicorn's, so
# vLLM's and SGLang's), so a request rarely lands on a connection the server just closed.
KEEPALIVE_EXPIRY = 4.0


@cache
def tls_context() -> ssl.SSLContext:
    """httpx's default TLS settings, with the CA bundle loaded once for every pool (each
    client would otherwise load it again: tens of milliseconds apiece)."""
    return httpx.create_ssl_context()


def transport_error(exc: httpx.HTTPError) -> TransportError:
    """httpx's error as the seam's (``transport``): the relay knows one tree."""
    if isinstance(exc, httpx.ConnectTimeout):
        return ConnectTimeout()
    if isinstance(exc, httpx.PoolTimeout):
        return PoolTimeout()
    if isinstance(exc, httpx.TimeoutException):
        return ReadTimeout()
    if isinstance(exc, httpx.ConnectError):
        return ConnectError(str(exc))
    return BrokenConnection(type(exc).__name__)


class HttpxReply:
    """An httpx response as the relay reads one (``transport.Reply``), raising the seam's errors."""

    __slots__ = ("_resp", "_stream", "headers", "status")

    def __init__(self, resp: httpx.Response) -> None:
        self.status = resp.status_code
        self.headers: Mapping[str, str] = resp.headers
        self._resp = resp
        self._stream: AsyncIterator[bytes] | None = None

    def __aiter__(self) -> AsyncIterator[bytes]:
        if self._stream is None:
            self._stream = self._chunks()
        return self._stream

    async def _chunks(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._resp.aiter_bytes():
                yield chunk
        except httpx.HTTPError as exc:
            raise transport_error(exc) from None

    async def read(self) -> bytes:
        try:
            return await self._resp.aread()
        except httpx.HTTPError as exc:
            raise transport_error(exc) from None

    async def drain(self, seconds: float) -> None:
        try:
            async with asyncio.timeout(seconds):
                async for _ in self:
                    pass
        except (TimeoutError, TransportError):
            pass


class ClientSet:
    def __init__(self, max_connections: int, timeout: httpx.Timeout | None = None, pools: int = POOLS) -> None:
        count = max(1, min(pools, max_connections))
        per = max(1, max_connections // count)
        limits = httpx.Limits(max_connections=per, max_keepalive_connections=per, keepalive_expiry=KEEPALIVE_EXPIRY)
        self.clients = [httpx.AsyncClient(limits=limits, timeout=timeout, verify=tls_context()) for _ in range(count)]
        self._busy = [0] * count
        self._next = 0
        self.max_connections = max_connections
        self._wire: dict[tuple[str, str, int | None], Pool] = {}

    def _pick(self) -> int:
        start = self._next
        self._next = (start + 1) % len(self.clients)
        best = start
        for k in range(len(self.clients)):
            i = (start + k) % len(self.clients)
            if not self._busy[i]:
                return i
            if self._busy[i] < self._busy[best]:
                best = i
        return best

    def any(self) -> httpx.AsyncClient:
        """A client for a one-off call (health checks), not counted."""
        return self.clients[self._pick()]

    @asynccontextmanager
    async def stream(self, method: str, url: str, **kwargs: Any) -> AsyncIterator[httpx.Response]:
        """``httpx.AsyncClient.stream`` on the least busy pool."""
        i = self._pick()
        self._busy[i] += 1
        try:
            async with self.clients[i].stream(method, url, **kwargs) as resp:
                yield resp
        finally:
            self._busy[i] -= 1

    def wire_pool(self, url: str) -> Pool:
        """The lean client's pool for ``url``'s origin (engines/upstream/wire.py), one per
        origin, holding at most ``max_connections`` like the httpx pools together."""
        from kimi_server.engines.upstream.wire_pool import Pool

        parts = urlsplit(url)
        origin = (parts.scheme, parts.hostname or "", parts.port)
        pool = self._wire.get(origin)
        if pool is None:
            pool = self._wire[origin] = Pool(url, self.max_connections)
        return pool

    async def aclose(self) -> None:
        for pool in self._wire.values():
            pool.close()
        for client in self.clients:
            await client.aclose()


class HttpxTransport:
    """httpx as the relay's transport: it honours HTTP(S)_PROXY, ALL_PROXY and NO_PROXY."""

    name: TransportName = "httpx"

    def __init__(self, clients: ClientSet, url: str, headers: Mapping[str, str], timeout: httpx.Timeout) -> None:
        self.clients = clients
        self.url = url
        self.headers = headers
        self.timeout = timeout

    @asynccontextmanager
    async def post(self, body: dict[str, Any]) -> AsyncIterator[HttpxReply]:
        try:
            async with self.clients.stream(
                "POST", self.url, json=body, headers=self.headers, timeout=self.timeout
            ) as resp:
                yield HttpxReply(resp)
        except httpx.HTTPError as exc:
            raise transport_error(exc) from None
