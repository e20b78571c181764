"""Fetching an image or video a client names by http(s) URL, only where the operator allows.

Refused with a 400 unless: the host is on ``media_allowed_hosts``; every address it resolves
to is public (not private, loopback, link-local, multicast, reserved or unspecified); the
socket actually connected to such an address (checked again on the connection, so DNS that
changes between the check and the connect gains nothing); a redirect stays on the same host
(and is checked again); the body fits the size cap and arrives within the timeout.

The connection goes to the address that was checked, never to a name resolved again later:
a small HTTP/1.0 client over asyncio streams (TLS with the host name for SNI and certificate
checks), so no library resolves behind the check's back.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

from kimi_server.media.checks import refuse

MAX_REDIRECTS = 3
MAX_HEADER_BYTES = 64 * 1024

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


@dataclass
class Fetcher:
    allowed_hosts: Sequence[str]
    timeout_s: float
    resolve: Resolver = system_resolve
    address_ok: AddressRule = is_public  # tests may widen it; operators cannot

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
            status, location, body = await self._get(parts.scheme, host, parts.port, url, where, max_bytes)
            if status in (301, 302, 303, 307, 308) and location:
                url = urljoin(url, location)
                continue
            if status != 200:
                raise refuse(where, f"fetching the URL failed with HTTP {status}.", "media_fetch_failed")
            return body
        raise refuse(where, "the URL redirects too often.", "media_fetch_failed")

    async def _get(
        self, scheme: str, host: str, port: int | None, url: str, where: str, max_bytes: int
    ) -> tuple[int, str | None, bytes]:
        port = port or (443 if scheme == "https" else 80)
        try:
            addresses = await self.resolve(host, port)
        except OSError:
            raise refuse(where, f"the host {host!r} could not be resolved.", "media_fetch_failed") from None
        if not addresses or not all(self.address_ok(a) for a in addresses):
            raise refuse(where, "the URL's host has a private or reserved address.", "media_fetch_refused")
        tls = ssl.create_default_context() if scheme == "https" else None
        try:
            reader, writer = await asyncio.open_connection(
                addresses[0], port, ssl=tls, server_hostname=host if tls else None
            )
        except (OSError, ssl.SSLError):
            raise refuse(where, "the URL's host could not be reached.", "media_fetch_failed") from None
        try:
            peer = writer.get_extra_info("peername")
            if not peer or not self.address_ok(str(peer[0])):
                raise refuse(where, "the URL's host has a private or reserved address.", "media_fetch_refused")
            parts = urlsplit(url)
            target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            writer.write(
                f"GET {target} HTTP/1.0\r\nHost: {parts.netloc}\r\nUser-Agent: kimi-server\r\n"
                "Accept: image/*, video/*\r\nConnection: close\r\n\r\n".encode("ascii", "strict")
            )
            await writer.drain()
            return await _read_response(reader, where, max_bytes)
        except (
            OSError,
            ssl.SSLError,
            UnicodeError,
            ValueError,
            IndexError,
            asyncio.LimitOverrunError,
            asyncio.IncompleteReadError,
        ):
            raise refuse(where, "fetching the URL failed.", "media_fetch_failed") from None
        finally:
            writer.close()


async def _read_response(reader: asyncio.StreamReader, where: str, max_bytes: int) -> tuple[int, str | None, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")  # bounded by the reader's 64 KiB limit
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    if status != 200:
        return status, headers.get("location"), b""
    length = headers.get("content-length")
    if length is not None and int(length) > max_bytes:
        raise refuse(where, f"the file is larger than {max_bytes} bytes.", "media_too_large")
    body = bytearray()
    while chunk := await reader.read(65536):
        body += chunk
        if len(body) > max_bytes:
            raise refuse(where, f"the file is larger than {max_bytes} bytes.", "media_too_large")
    return status, None, bytes(body)
