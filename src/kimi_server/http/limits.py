"""Refuses request bodies over the configured size before anything parses them: ``max_bytes``,
or ``upload_bytes`` on the upload paths (``http/routes.py:UPLOADS``)."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kimi_server.errors import PayloadTooLargeError
from kimi_server.http.errors import send_error
from kimi_server.http.routes import UPLOADS


class BodySizeLimit:
    def __init__(self, app: ASGIApp, max_bytes: int, upload_bytes: int | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.upload_bytes = upload_bytes if upload_bytes is not None else max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.upload_bytes if scope.get("path", "") in UPLOADS else self.max_bytes
        verdict = self._verdict(dict(scope["headers"]), limit)
        if verdict == "refuse":
            await self._refuse(send, scope, limit)
            return
        if verdict == "pass":
            await self.app(scope, receive, send)
            return
        count = _BodyCount(receive, send, limit)
        try:
            await self.app(scope, count.receive, count.send)
        except _TooLarge:
            if not count.started:
                await self._refuse(send, scope, limit)
            return
        except Exception:
            if not count.refused:
                raise
        if count.refused and not count.started:
            await self._refuse(send, scope, limit)

    def _verdict(self, headers: dict[bytes, bytes], limit: int) -> str:
        """``refuse`` a declared length over the limit; ``pass`` a body the HTTP parser bounds
        already (it delivers exactly the declared length) or no body at all; ``count`` one of
        unknown length (chunked) as it is read."""
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            return "refuse"
        return "count" if b"transfer-encoding" in headers else "pass"

    async def _refuse(self, send: Send, scope: Scope, limit: int) -> None:
        error = PayloadTooLargeError(f"The request body is larger than this server accepts ({limit} bytes).")
        await send_error(send, error, close=True, path=scope.get("path", ""))  # the rest is never read


class _TooLarge(Exception):
    pass


class _BodyCount:
    """A body of unknown length (chunked) counted as it is read."""

    def __init__(self, receive: Receive, send: Send, max_bytes: int) -> None:
        self._receive = receive
        self._send = send
        self.max_bytes = max_bytes
        self.seen = 0
        self.refused = False
        self.started = False

    async def receive(self) -> Message:
        message = await self._receive()
        if message["type"] == "http.request":
            self.seen += len(message.get("body", b""))
            if self.seen > self.max_bytes:
                self.refused = True
                raise _TooLarge
        return message

    async def send(self, message: Message) -> None:
        # Once the body is over the limit, whatever the app answers (a parse error, say) is
        # dropped: the answer is the 413.
        if self.refused:
            return
        self.started = True
        await self._send(message)
