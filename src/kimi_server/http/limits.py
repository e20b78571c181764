"""Refuses request bodies over the configured size before anything parses them."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kimi_server.errors import PayloadTooLargeError
from kimi_server.http.errors import send_error


class BodySizeLimit:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(send)
            return
        seen = 0
        refused = False

        async def counting_receive() -> Message:
            nonlocal seen, refused
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    refused = True
                    raise _TooLarge
            return message

        started = False

        async def guarded_send(message: Message) -> None:
            # Once the body is over the limit, whatever the app answers (a parse error, say)
            # is dropped: the answer is the 413 below.
            nonlocal started
            if refused:
                return
            started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, guarded_send)
        except _TooLarge:
            if not started:
                await self._refuse(send)
            return
        except Exception:
            if not refused:
                raise
        if refused and not started:
            await self._refuse(send)

    async def _refuse(self, send: Send) -> None:
        error = PayloadTooLargeError(f"The request body is larger than this server accepts ({self.max_bytes} bytes).")
        await send_error(send, error, close=True)  # the rest of the body is never read


class _TooLarge(Exception):
    pass
