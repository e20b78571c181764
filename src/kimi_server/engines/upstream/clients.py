"""Connections to one upstream, spread over several small httpx pools.

One httpx pool checks every connection it holds on every request (idle, expired, readable), so
its CPU cost per request grows with its size: at 64 requests in flight one pool of 256 costs
about three times what sixteen pools of 16 cost together. Each request takes the pool with the
fewest requests in flight (round-robin on ties), so no pool waits for a connection while
another has room.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import cache
from typing import Any

import httpx

POOLS = 16
# Idle connections are dropped before the common 5 s server keep-alive ends (uvicorn's, so
# vLLM's and SGLang's), so a request rarely lands on a connection the server just closed.
KEEPALIVE_EXPIRY = 4.0


@cache
def tls_context() -> ssl.SSLContext:
    """httpx's default TLS settings, with the CA bundle loaded once for every pool (each
    client would otherwise load it again: tens of milliseconds apiece)."""
    return httpx.create_ssl_context()


class ClientSet:
    def __init__(self, max_connections: int, timeout: httpx.Timeout | None = None, pools: int = POOLS) -> None:
        count = max(1, min(pools, max_connections))
        per = max(1, max_connections // count)
        limits = httpx.Limits(max_connections=per, max_keepalive_connections=per, keepalive_expiry=KEEPALIVE_EXPIRY)
        self.clients = [httpx.AsyncClient(limits=limits, timeout=timeout, verify=tls_context()) for _ in range(count)]
        self._busy = [0] * count
        self._next = 0

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

    async def aclose(self) -> None:
        for client in self.clients:
            await client.aclose()
