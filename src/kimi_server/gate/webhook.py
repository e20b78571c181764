"""The operator's webhook: a JSON event POSTed to ``budget_webhook_url``, signed, retried.

Each attempt carries ``X-Kimi-Timestamp`` (Unix seconds) and ``X-Kimi-Signature:
sha256=<hex>``, the HMAC-SHA256 of ``<timestamp>.<body>`` under ``budget_webhook_secret``:
the receiver recomputes it over the raw body and rejects an old timestamp, so a captured
delivery cannot be replayed later. A failed attempt (no answer, or a status other than 2xx) is
retried after 1, 2, 4, 8 seconds, at most ``ATTEMPTS`` in all; redirects are not followed.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import time
from collections.abc import Awaitable, Callable

import httpx

SIGNATURE_HEADER = "X-Kimi-Signature"
TIMESTAMP_HEADER = "X-Kimi-Timestamp"
EVENT_HEADER = "X-Kimi-Event"
ATTEMPTS = 5
TIMEOUT = 10.0  # seconds per attempt


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """The signature header's value for ``body`` sent at ``timestamp``."""
    mac = hmac.new(secret.encode(), str(timestamp).encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


class Webhook:
    def __init__(self, url: str, secret: str) -> None:
        self.url = url
        self.secret = secret
        self.backoff = 1.0  # seconds before the first retry; doubled for each one after
        self._stop = asyncio.Event()
        self._client: httpx.AsyncClient | None = None

    async def deliver(self, event: str, body: bytes, on_attempt: Callable[[int, str | None], Awaitable[None]]) -> bool:
        """Sends until a 2xx answer or ``ATTEMPTS`` tries; ``on_attempt(n, error)`` after each."""
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=TIMEOUT, follow_redirects=False)
        for attempt in range(1, ATTEMPTS + 1):
            stamp = int(time.time())
            headers = {
                "Content-Type": "application/json",
                EVENT_HEADER: event,
                TIMESTAMP_HEADER: str(stamp),
                SIGNATURE_HEADER: sign(self.secret, stamp, body),
            }
            error: str | None
            try:
                answer = await self._client.post(self.url, content=body, headers=headers)
                error = None if 200 <= answer.status_code < 300 else f"HTTP {answer.status_code}"
            except httpx.HTTPError as exc:
                error = type(exc).__name__  # never the URL: it may hold a token
            await on_attempt(attempt, error)
            if error is None:
                return True
            if attempt < ATTEMPTS and await self._stopped_within(self.backoff * 2 ** (attempt - 1)):
                break
        return False

    async def _stopped_within(self, seconds: float) -> bool:
        try:
            await asyncio.wait_for(self._stop.wait(), seconds)
        except TimeoutError:
            return False
        return True

    def stop(self) -> None:
        """No more retries (shutting down): the attempt in progress still finishes."""
        self._stop.set()

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
