"""One upstream server: its pooled HTTP clients, its breaker, and one streamed attempt.

The attempt's request goes through the upstream's transport (``transport``), chosen once: the
lean client (``wire``), or httpx where a proxy applies or the configuration asks for it; health
checks and the other one-off calls use httpx (``Upstream.client``).

An attempt yields engine events as the upstream's SSE chunks arrive (no buffering) and raises
``Failure`` describing what went wrong and what may be done about it (retry, fail over).
Leaving the ``async with`` of the stream closes the upstream request at once, which is what
happens when the client disconnects and Starlette closes the generators above.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import AsyncGenerator, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from kimi_server.engines.types import EngineEvent, Finish
from kimi_server.engines.upstream.breaker import CircuitBreaker
from kimi_server.engines.upstream.clients import ClientSet, HttpxTransport
from kimi_server.engines.upstream.dialects import get_dialect
from kimi_server.engines.upstream.errors import (
    BadGatewayError,
    GatewayTimeoutError,
    UpstreamRateLimitError,
    UpstreamStreamError,
    UpstreamUnavailableError,
)
from kimi_server.engines.upstream.normalise import Normaliser
from kimi_server.engines.upstream.scrub import register_upstream, scrub
from kimi_server.engines.upstream.sse import SSEParser
from kimi_server.engines.upstream.transport import (
    ConnectError,
    ConnectTimeout,
    PoolTimeout,
    Reply,
    Transport,
    TransportError,
    TransportTimeout,
)
from kimi_server.engines.upstream.wire_pool import Timeouts, WireTransport, proxied, request_head
from kimi_server.errors import APIError, InvalidRequestError, PayloadTooLargeError
from kimi_server.settings import UpstreamConfig

log = logging.getLogger(__name__)
MAX_ERROR_BODY = 16_384
DRAIN_SECONDS = 0.5


@dataclass
class Failure(Exception):
    error: APIError
    retry: bool = True  # the same upstream may be asked again
    failover: bool = True  # another upstream may be asked
    counts: bool = True  # towards the breaker
    retry_after: float | None = None


class Upstream:
    def __init__(self, cfg: UpstreamConfig, clients: ClientSet | None = None) -> None:
        self.cfg = cfg
        self.dialect = get_dialect(cfg.dialect)
        parts = urlsplit(cfg.base_url)
        self.name = cfg.name or parts.netloc or cfg.base_url
        self.base = cfg.base_url.rstrip("/")
        register_upstream(self.base)
        self.url = f"{self.base}/chat/completions"
        self.breaker = CircuitBreaker(cfg.breaker_threshold, cfg.breaker_cooldown)
        key = os.environ.get(cfg.api_key_env, "") if cfg.api_key_env else ""
        if cfg.api_key_env and not key:
            log.warning("upstream %s: the environment variable %s is not set", self.name, cfg.api_key_env)
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.timeout = httpx.Timeout(
            connect=cfg.connect_timeout, read=cfg.read_timeout, write=cfg.read_timeout, pool=cfg.connect_timeout
        )
        self.clients = clients or ClientSet(cfg.max_connections, self.timeout)
        self.transport = self._transport()

    def _transport(self) -> Transport:
        """The lean client unless httpx is asked for, a proxy applies, or the URL or key is one
        only httpx sends (or refuses)."""
        if self.cfg.transport == "auto" and not proxied(self.url):
            try:
                head = request_head(self.url, self.headers)
            except ValueError:
                pass
            else:
                cfg = self.cfg
                timeouts = Timeouts(connect=cfg.connect_timeout, read=cfg.read_timeout, pool=cfg.connect_timeout)
                return WireTransport(self.clients.wire_pool(self.url), head, timeouts)
        return HttpxTransport(self.clients, self.url, self.headers, self.timeout)

    @property
    def client(self) -> httpx.AsyncClient:
        """A client for one-off calls (health checks); relayed requests go through ``transport``."""
        return self.clients.any()

    async def close(self) -> None:
        await self.clients.aclose()

    def _scrub(self, text: str) -> str:
        return scrub(text)

    def failure_for_status(self, status: int, raw: bytes, headers: Mapping[str, str]) -> Failure:
        detail = ""
        try:
            err = json.loads(raw).get("error")
            detail = err.get("message", "") if isinstance(err, dict) else str(err or "")
        except (ValueError, AttributeError):
            pass
        said = f": {self._scrub(detail)}" if detail else "."
        if status in (400, 422):
            return Failure(
                InvalidRequestError(f"The model's engine rejected the request{said}", code="upstream_rejected"),
                retry=False,
                failover=False,
                counts=False,
            )
        if status == 413:
            return Failure(
                PayloadTooLargeError("The request is too large for the model's engine."),
                retry=False,
                failover=False,
                counts=False,
            )
        if status == 429:
            return Failure(
                UpstreamRateLimitError("The model's engine is busy; retry shortly."),
                counts=False,
                retry_after=_retry_after(headers.get("retry-after")),
            )
        if status in (401, 403, 404):
            what = "does not serve this model" if status == 404 else "refused this server's credentials"
            return Failure(BadGatewayError(f"The model's engine {what}."), retry=False)
        if status == 408 or status == 504:
            return Failure(GatewayTimeoutError("The model's engine timed out."))
        if status == 503:
            return Failure(
                UpstreamUnavailableError("The model's engine is unavailable."),
                retry_after=_retry_after(headers.get("retry-after")),
            )
        return Failure(BadGatewayError(f"The model's engine failed (HTTP {status})."))

    def _post(self, body: dict[str, Any]) -> _Call:
        return _Call(self, body)

    async def attempt(
        self, body: dict[str, Any], normaliser: Normaliser, *, piece_limit: int, deadline: float
    ) -> AsyncGenerator[EngineEvent, None]:
        # The relay loop is written out here rather than in a generator of its own: one
        # generator layer less for every streamed event.
        async with self._post(body) as resp:
            tail = await self._opening(resp, normaliser, deadline)
            if tail is None:
                parser = SSEParser()
                async for raw in resp:
                    # Checked on every read, not only on events: an upstream sending nothing
                    # but keep-alive comments still ends at the deadline.
                    if time.monotonic() > deadline:
                        raise Failure(GatewayTimeoutError("The model's engine took too long."), retry=False)
                    for data in parser.feed(raw):
                        if data == b"[DONE]":
                            for event in normaliser.finish():
                                yield event
                            # The few bytes left (the end of the chunked body), so the
                            # connection is kept; an upstream that lingers is not waited for.
                            await resp.drain(DRAIN_SECONDS)
                            return
                        for event in _events(data, normaliser, piece_limit):
                            yield event
                        if normaliser.pieces > piece_limit:
                            return
                tail = _ending(normaliser, parser)
            for event in tail:
                yield event

    async def _opening(self, resp: Reply, normaliser: Normaliser, deadline: float) -> list[EngineEvent] | None:
        """A Failure for an error status; the whole answer's events from an upstream that
        ignored stream=true (awaited no longer than the generation's deadline); else None: the
        body is an event stream."""
        if resp.status != 200:
            raw = b""
            async for part in resp:
                raw += part
                if len(raw) > MAX_ERROR_BODY:
                    break
            raise self.failure_for_status(resp.status, raw, resp.headers)
        if "json" not in resp.headers.get("content-type", ""):
            return None
        try:
            async with asyncio.timeout(max(deadline - time.monotonic(), 0.0)):
                whole = await resp.read()
        except TimeoutError:
            raise Failure(GatewayTimeoutError("The model's engine took too long."), retry=False) from None
        return [*normaliser.feed(_loads(whole)), *normaliser.finish()]


class _Call:
    """One relayed request on the upstream's transport. Transport errors become Failures,
    whether they come while connecting or while the body streams."""

    __slots__ = ("body", "cm", "up")

    def __init__(self, up: Upstream, body: dict[str, Any]) -> None:
        self.up = up
        self.body = body
        self.cm: AbstractAsyncContextManager[Reply] | None = None

    async def __aenter__(self) -> Reply:
        cm = self.up.transport.post(self.body)
        try:
            resp = await cm.__aenter__()
        except TransportError as exc:
            raise _transport_failure(exc) from None
        self.cm = cm
        return resp

    async def __aexit__(self, typ: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        assert self.cm is not None
        try:
            await self.cm.__aexit__(typ, exc, tb)
        except TransportError as closing:
            exc = exc or closing
        if isinstance(exc, TransportError):
            raise _transport_failure(exc) from None


def _transport_failure(exc: TransportError) -> Failure:
    if isinstance(exc, TransportTimeout):
        where = "connect" if isinstance(exc, ConnectTimeout | PoolTimeout) else "respond"
        return Failure(GatewayTimeoutError(f"The model's engine did not {where} in time."))
    if isinstance(exc, ConnectError):
        return Failure(UpstreamUnavailableError("The model's engine is unreachable."))
    return Failure(UpstreamStreamError("The model's engine dropped the connection."))


def _events(data: bytes, normaliser: Normaliser, piece_limit: int) -> list[EngineEvent]:
    """One SSE event's engine events; past the output cap, the answer's end after them."""
    chunk = _loads(data)
    if "error" in chunk and not chunk.get("choices"):
        raise Failure(UpstreamStreamError("The model's engine reported an error mid-stream."))
    events = normaliser.feed(chunk)
    if normaliser.pieces > piece_limit:
        # An upstream that will not stop: end the answer at the output cap.
        ending = normaliser.finish()
        return [*events, *(Finish("length", e.usage) if isinstance(e, Finish) else e for e in ending)]
    return events


def _ending(normaliser: Normaliser, parser: SSEParser) -> list[EngineEvent]:
    """The stream ended without ``[DONE]``: fine (some servers omit it) if the answer did."""
    if normaliser.finish_reason is None or parser.pending():
        raise Failure(UpstreamStreamError("The model's engine ended the stream early."))
    return normaliser.finish()


_DECODER = json.JSONDecoder()


def _loads(data: bytes) -> dict[str, Any]:
    try:
        # An object's first byte rules out a byte-order mark, so the text is plain UTF-8 and
        # json.loads' encoding detection can be skipped.
        chunk = _DECODER.decode(data.decode()) if data[:1] == b"{" else json.loads(data)
    except ValueError:
        raise Failure(UpstreamStreamError("The model's engine sent malformed data.")) from None
    if not isinstance(chunk, dict):
        raise Failure(UpstreamStreamError("The model's engine sent malformed data."))
    return chunk


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        return None  # an HTTP date: treat as unknown and use our own backoff
