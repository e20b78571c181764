"""Connections to one upstream, spread over several small httpx pools.

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


class HttpxReply:
    """An httpx response as the relay reads one: ``status``, ``headers``, ``async for`` over the
    body, ``read()`` and ``drain(seconds)``, like the lean client's ``wire.Response``."""

    __slots__ = ("_resp", "_stream", "headers", "status")

    def __init__(self, resp: httpx.Response) -> None:
        self.status = resp.status_code
        self.headers: Mapping[str, str] = resp.headers
        self._resp = resp
        self._stream: AsyncIterator[bytes] | None = None

    def __aiter__(self) -> AsyncIterator[bytes]:
        if self._stream is None:
            self._stream = self._resp.aiter_bytes()
        return self._stream

    async def read(self) -> bytes:
        return await self._resp.aread()

    async def drain(self, seconds: float) -> None:
        """Reads what is left (after ``[DONE]``, the end of the chunked body) so the connection
        goes back to the pool; a server that lingers is not waited for."""
        try:
            async with asyncio.timeout(seconds):
                async for _ in self:
                    pass
        except (TimeoutError, httpx.HTTPError):
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

    @asynccontextmanager
    async def post(
        self, url: str, body: Any, headers: Mapping[str, str], timeouts: httpx.Timeout
    ) -> AsyncIterator[HttpxReply]:
        """The relay's call through httpx, for upstreams behind a proxy: the lean client's
        response interface over ``stream``."""
        async with self.stream("POST", url, json=body, headers=headers, timeout=timeouts) as resp:
            yield HttpxReply(resp)

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
