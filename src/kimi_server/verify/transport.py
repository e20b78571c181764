"""The run's HTTP transport: httpx's own, with every socket operation held to a wall-clock
deadline (``verify/deadline.py``).

httpx (and the ``openai`` SDK over it) time out each read, connect or write on its own; an
endpoint that sends a byte before each read times out never answers, and never fails either.
Here each connect, read and write gets at most the time left before the request's deadline,
and none starts once it has passed, so a request ends by its deadline whether its answer
stalls, trickles or never stops. Body reads happen after ``handle_request`` returns (a stream
is read as the caller iterates it), so the response stream carries its request's deadline.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from ssl import SSLContext
from typing import Any

import httpcore
import httpx

from kimi_server.verify.deadline import Deadline, request_deadline

# The instant (time.monotonic()) by which the socket operation in progress must end; None
# outside a request made through this transport.
_io_deadline: ContextVar[float | None] = ContextVar("verify_io_deadline", default=None)


def _bounded(timeout: float | None, error: type[httpcore.TimeoutException]) -> float | None:
    """The operation's own timeout, cut to the time left; ``error`` once none is left."""
    at = _io_deadline.get()
    if at is None:
        return timeout
    left = at - time.monotonic()
    if left <= 0:
        raise error("the deadline passed")
    return left if timeout is None else min(timeout, left)


class _Stream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _bounded(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _bounded(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self, ssl_context: SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        bounded = _bounded(timeout, httpcore.ConnectTimeout)
        return _Stream(self._inner.start_tls(ssl_context, server_hostname, bounded))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _Backend(httpcore.NetworkBackend):
    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        bounded = _bounded(timeout, httpcore.ConnectTimeout)
        return _Stream(self._inner.connect_tcp(host, port, bounded, local_address, socket_options))

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        bounded = _bounded(timeout, httpcore.ConnectTimeout)
        return _Stream(self._inner.connect_unix_socket(path, bounded, socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class _Body(httpx.SyncByteStream):
    """A response body whose reads keep the deadline of the request that asked for it."""

    def __init__(self, inner: httpx.SyncByteStream, at: float) -> None:
        self._inner = inner
        self._at = at

    def __iter__(self) -> Iterator[bytes]:
        parts = iter(self._inner)
        while True:
            token = _io_deadline.set(self._at)
            try:
                part = next(parts, None)
            finally:
                _io_deadline.reset(token)
            if part is None:
                return
            yield part

    def close(self) -> None:
        self._inner.close()


class DeadlineTransport(httpx.HTTPTransport):
    def __init__(self, request_seconds: float, *, proxy: str | None = None) -> None:
        super().__init__(proxy=proxy)
        # httpx builds its connection pool without a way to name the network backend; fail at
        # once on a version where the pool is not where this transport expects it, rather than
        # run without deadlines.
        pool: Any = self._pool
        if not isinstance(getattr(pool, "_network_backend", None), httpcore.SyncBackend):
            raise RuntimeError("this httpx/httpcore version is not supported by kimi-server verify's transport")
        pool._network_backend = _Backend()
        self.request_seconds = request_seconds

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        deadline = request_deadline(self.request_seconds)
        _pool_wait_within(request, deadline)
        token = _io_deadline.set(deadline.at)
        try:
            response = super().handle_request(request)
        finally:
            _io_deadline.reset(token)
        assert isinstance(response.stream, httpx.SyncByteStream)
        response.stream = _Body(response.stream, deadline.at)
        return response


def _pool_wait_within(request: httpx.Request, deadline: Deadline) -> None:
    """Waiting for a free connection is no socket operation: bound it through httpcore's own
    pool timeout."""
    left = max(deadline.left(), 0.001)
    timeouts = dict(request.extensions.get("timeout") or {})
    pool = timeouts.get("pool")
    timeouts["pool"] = left if pool is None else min(pool, left)
    request.extensions["timeout"] = timeouts


def client(base_url: str, request_seconds: float) -> httpx.Client:
    """An httpx client whose every request ends by its deadline; a proxy named in the
    environment is still used (through this transport, so under the same deadlines)."""
    transport = DeadlineTransport(request_seconds, proxy=_environment_proxy(base_url))
    # trust_env off: httpx would otherwise route proxied URLs through transports of its own.
    timeout = httpx.Timeout(request_seconds, connect=min(10.0, request_seconds))
    return httpx.Client(transport=transport, timeout=timeout, trust_env=False)


def _environment_proxy(url: str) -> str | None:
    parsed = httpx.URL(url)
    if urllib.request.proxy_bypass(parsed.host):
        return None
    proxies = urllib.request.getproxies()
    found = proxies.get(parsed.scheme) or proxies.get("all")
    if not found:
        return None
    return found if "://" in found else f"http://{found}"
