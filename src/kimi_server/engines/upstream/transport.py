"""The seam under the relay's one hot call (POST the body, stream the answer back): a transport,
chosen once per upstream, and one tree of errors that every transport raises.

Two transports stand behind it: the lean client (``wire``, ``wire_pool``), the default, and
httpx (``clients``), for an upstream behind a proxy, one whose URL or key the lean client does
not send, or one an operator puts on it (``transport = "httpx"``, also how the relay benchmark
measures the lean client's share). The seam is this module's own rather than httpx's
``AsyncBaseTransport``: that interface takes and returns httpx's Request and Response objects,
whose construction alone costs tens of microseconds a call, the very cost the lean client is
there to avoid. Health checks, token counts and other one-off calls use httpx directly.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any, Literal, Protocol

TransportName = Literal["wire", "httpx"]


class TransportError(Exception):
    """No usable response: the exchange failed below HTTP."""


class TransportTimeout(TransportError):
    pass


class ConnectTimeout(TransportTimeout):
    pass


class PoolTimeout(TransportTimeout):
    """Every connection the upstream may have was busy for the whole pool timeout."""


class ReadTimeout(TransportTimeout):
    pass


class ConnectError(TransportError):
    pass


class BrokenConnection(TransportError):
    """The connection broke, or the server sent something that is not HTTP/1.1."""


class Reply(Protocol):
    """A response as the relay reads it: ``status`` and ``headers`` (lower-case names) once the
    head has arrived, then the body through ``async for``, ``read()`` or ``drain(seconds)``.
    Reading raises only ``TransportError``s."""

    @property
    def status(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    def __aiter__(self) -> AsyncIterator[bytes]: ...

    async def read(self) -> bytes: ...

    async def drain(self, seconds: float) -> None:
        """Reads what is left for at most ``seconds``, so the connection may be kept; an error
        or a server that lingers only means it is closed instead."""


class Transport(Protocol):
    name: TransportName

    def post(self, body: dict[str, Any]) -> AbstractAsyncContextManager[Reply]:
        """``async with transport.post(body) as reply``: the reply once its head has arrived;
        leaving the block ends the exchange (the connection is kept only if the body was read
        whole). Raises only ``TransportError``s."""
        ...
