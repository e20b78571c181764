"""Fetching an image or video a client names by http(s) URL, only where the operator allows.

Refused with a 400 unless: the host is on ``media_allowed_hosts``; every address it resolves
to is public (not private, loopback, link-local, multicast, reserved or unspecified); the
socket actually connected to such an address (checked again on the connection, so DNS that
changes between the check and the connect gains nothing); a redirect stays on the same host
(and is checked again, DNS included); the body fits the size cap and arrives within the timeout.

The request is httpx's, over a connection opened to the address that was checked, never to a
name resolved again later: the transport's network backend (``_PinnedBackend``) connects to
that address whatever host it is asked for, while TLS still verifies the certificate and sends
SNI for the host name. No proxy from the environment applies, and redirects are followed here,
one checked hop at a time.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

import httpcore
import httpx

from kimi_server.media.checks import refuse

MAX_REDIRECTS = 3
REDIRECTS = frozenset({301, 302, 303, 307, 308})

Resolver = Callable[[str, int], Awaitable[list[str]]]
AddressRule = Callable[[str], bool]


def is_public(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not (ip.is_multicast or ip.is_reserved or ip.is_unspecified)


async def system_resolve(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def host_allowed(host: str, allowed: Sequence[str]) -> bool:
    """Exact host names, or ``*.example.com`` for the subdomains of example.com."""
    host = host.lower().rstrip(".")
    for entry in allowed:
        entry = entry.lower().rstrip(".")
        if entry.startswith("*.") and host.endswith(entry[1:]):
            return True
        if host == entry:
            return True
    return False


class _NotPublic(Exception):
    """The connection's peer is not an address the rule allows."""


class _PinnedBackend(httpcore.AsyncNetworkBackend):
    """Opens every connection to ``address`` (checked already), and checks the peer again."""

    def __init__(self, address: str, address_ok: AddressRule) -> None:
        self.address = address
        self.address_ok = address_ok
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109  (httpcore's interface)
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        stream = await self._inner.connect_tcp(self.address, port, timeout, local_address, socket_options)
        peer = stream.get_extra_info("server_addr")
        if not peer or not self.address_ok(str(peer[0])):
            await stream.aclose()
            raise _NotPublic()
        return stream

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109  (httpcore's interface)
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("media is fetched over TCP only")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class _PinnedTransport(httpx.AsyncHTTPTransport):
    """httpx's own transport with its connections opened by ``_PinnedBackend`` (httpx 0.28
    takes no network backend of its own; its pool, from httpcore, does)."""

    def __init__(self, backend: _PinnedBackend, tls: ssl.SSLContext) -> None:
        super().__init__(trust_env=False)
        self._pool = httpcore.AsyncConnectionPool(ssl_context=tls, max_connections=1, network_backend=backend)


@dataclass
class Fetcher:
    allowed_hosts: Sequence[str]
    timeout_s: float
    resolve: Resolver = system_resolve
    address_ok: AddressRule = is_public  # tests may widen it; operators cannot
    tls: ssl.SSLContext | None = None  # None: the system's trust store (tests bring their own CA)

    async def fetch(self, url: str, where: str, max_bytes: int) -> bytes:
        try:
            async with asyncio.timeout(self.timeout_s):
                return await self._follow(url, where, max_bytes)
        except TimeoutError:
            why = f"fetching the URL took longer than {self.timeout_s:g} s."
            raise refuse(where, why, "media_fetch_failed") from None

    async def _follow(self, url: str, where: str, max_bytes: int) -> bytes:
        first_host = urlsplit(url).hostname
        for _ in range(MAX_REDIRECTS + 1):
            parts = urlsplit(url)
            host = parts.hostname
            if parts.scheme not in ("http", "https") or not host:
                raise refuse(where, "only data: URLs and http(s) URLs are accepted.", "invalid_media_url")
            if host != first_host:
                raise refuse(where, "the URL redirects to another host.", "media_fetch_refused")
            if not host_allowed(host, self.allowed_hosts):
                raise refuse(
                    where,
                    f"fetching media from {host!r} is not allowed on this server (send the "
                    "file as a base64 data URL, or ask the operator to allow the host).",
                    "media_fetch_refused",
                )
            address = await self._checked_address(host, parts.port or (443 if parts.scheme == "https" else 80), where)
            status, location, body = await self._get(url, address, where, max_bytes)
            if status in REDIRECTS and location:
                url = urljoin(url, location)
                continue
            if status != 200:
                raise refuse(where, f"fetching the URL failed with HTTP {status}.", "media_fetch_failed")
            return body
        raise refuse(where, "the URL redirects too often.", "media_fetch_failed")

    async def _checked_address(self, host: str, port: int, where: str) -> str:
        """The address to connect to: the host's, once every address it has is public."""
        try:
            addresses = await self.resolve(host, port)
        except OSError:
            raise refuse(where, f"the host {host!r} could not be resolved.", "media_fetch_failed") from None
        if not addresses or not all(self.address_ok(a) for a in addresses):
            raise refuse(where, "the URL's host has a private or reserved address.", "media_fetch_refused")
        return addresses[0]

    async def _get(self, url: str, address: str, where: str, max_bytes: int) -> tuple[int, str | None, bytes]:
        transport = _PinnedTransport(_PinnedBackend(address, self.address_ok), self.tls or ssl.create_default_context())
        # Identity: the size cap counts the bytes as sent, and nothing is inflated here.
        headers = {"User-Agent": "kimi-server", "Accept": "image/*, video/*", "Accept-Encoding": "identity"}
        try:
            async with (
                httpx.AsyncClient(transport=transport, trust_env=False, timeout=self.timeout_s) as client,
                client.stream("GET", url, headers=headers) as response,
            ):
                if response.status_code != 200:
                    return response.status_code, response.headers.get("location"), b""
                return 200, None, await _read_capped(response, where, max_bytes)
        except _NotPublic:
            raise refuse(where, "the URL's host has a private or reserved address.", "media_fetch_refused") from None
        except httpx.ConnectError:
            raise refuse(where, "the URL's host could not be reached.", "media_fetch_failed") from None
        except (httpx.HTTPError, ssl.SSLError, OSError):
            raise refuse(where, "fetching the URL failed.", "media_fetch_failed") from None


async def _read_capped(response: httpx.Response, where: str, max_bytes: int) -> bytes:
    """The body, refused as soon as it is known to be (or grows) larger than ``max_bytes``."""
    length = response.headers.get("content-length", "")
    if length.isdigit() and int(length) > max_bytes:
        raise refuse(where, f"the file is larger than {max_bytes} bytes.", "media_too_large")
    body = bytearray()
    async for chunk in response.aiter_raw():
        body += chunk
        if len(body) > max_bytes:
            raise refuse(where, f"the file is larger than {max_bytes} bytes.", "media_too_large")
    return bytes(body)
