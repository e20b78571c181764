"""One upstream server: its pooled HTTP clients, its breaker, and one streamed attempt.

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
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from kimi_server.engines.types import EngineEvent, Finish
from kimi_server.engines.upstream.breaker import CircuitBreaker
from kimi_server.engines.upstream.clients import ClientSet
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

    @property
    def client(self) -> httpx.AsyncClient:
        """A client for one-off calls (health checks); requests go through ``clients.stream``."""
        return self.clients.any()

    async def close(self) -> None:
        await self.clients.aclose()

    def _scrub(self, text: str) -> str:
        return scrub(text)

    def failure_for_status(self, status: int, raw: bytes, headers: httpx.Headers) -> Failure:
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

    async def attempt(
        self, body: dict[str, Any], normaliser: Normaliser, *, piece_limit: int, deadline: float
    ) -> AsyncGenerator[EngineEvent, None]:
        try:
            async with self.clients.stream(
                "POST", self.url, json=body, headers=self.headers, timeout=self.timeout
            ) as resp:
                if resp.status_code != 200:
                    raw = b""
                    async for part in resp.aiter_bytes():
                        raw += part
                        if len(raw) > MAX_ERROR_BODY:
                            break
                    raise self.failure_for_status(resp.status_code, raw, resp.headers)
                if "json" in resp.headers.get("content-type", ""):
                    # An upstream that ignored stream=true: one whole completion, awaited no
                    # longer than the generation's deadline.
                    try:
                        async with asyncio.timeout(max(deadline - time.monotonic(), 0.0)):
                            whole = await resp.aread()
                    except TimeoutError:
                        raise Failure(GatewayTimeoutError("The model's engine took too long."), retry=False) from None
                    for event in normaliser.feed(_loads(whole)):
                        yield event
                    for event in normaliser.finish():
                        yield event
                    return
                # The relay loop is written out here rather than in a generator of its own: one
                # generator layer less for every streamed event.
                parser = SSEParser()
                stream = resp.aiter_bytes()
                async for raw in stream:
                    # Checked on every read, not only on events: an upstream sending nothing
                    # but keep-alive comments still ends at the deadline.
                    if time.monotonic() > deadline:
                        raise Failure(GatewayTimeoutError("The model's engine took too long."), retry=False)
                    for data in parser.feed(raw):
                        if data == b"[DONE]":
                            for event in normaliser.finish():
                                yield event
                            await _drain(stream)
                            return
                        chunk = _loads(data)
                        if "error" in chunk and not chunk.get("choices"):
                            raise Failure(UpstreamStreamError("The model's engine reported an error mid-stream."))
                        for event in normaliser.feed(chunk):
                            yield event
                        if normaliser.pieces > piece_limit:
                            # An upstream that will not stop: end the answer at the output cap.
                            for event in normaliser.finish():
                                yield Finish("length", event.usage) if isinstance(event, Finish) else event
                            return
                if normaliser.finish_reason is None or parser.pending():
                    raise Failure(UpstreamStreamError("The model's engine ended the stream early."))
                # Ended cleanly without the [DONE] sentinel: some servers omit it.
                for event in normaliser.finish():
                    yield event
        except httpx.TimeoutException as exc:
            where = "connect" if isinstance(exc, httpx.ConnectTimeout | httpx.PoolTimeout) else "respond"
            raise Failure(GatewayTimeoutError(f"The model's engine did not {where} in time.")) from None
        except httpx.ConnectError:
            raise Failure(UpstreamUnavailableError("The model's engine is unreachable.")) from None
        except httpx.TransportError:
            raise Failure(UpstreamStreamError("The model's engine dropped the connection.")) from None


async def _drain(stream: AsyncIterator[bytes]) -> None:
    """Reads the few bytes after ``[DONE]`` (the end of the chunked body), so the connection goes
    back to the pool instead of being closed; an upstream that lingers is not waited for."""
    try:
        async with asyncio.timeout(DRAIN_SECONDS):
            async for _ in stream:
                pass
    except (TimeoutError, httpx.HTTPError):
        pass


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
