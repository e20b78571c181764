"""The ASGI guard, before any route: the key is checked on the request head, before any body is
read, and the principal it names is left on the request's record, so the routes never check it
again (``http/state.py:authenticated`` reads it). A POST body to an API route is read here and
checked as JSON (``http/json_checks.py``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kimi_server.errors import APIError, AuthenticationError, RequestTimeoutError
from kimi_server.gate.auth import Principal
from kimi_server.gate.auth_throttle import AuthThrottle
from kimi_server.gate.request_record import request_record
from kimi_server.http.admin_key import admin_key_refusal, as_counted, bearer_token
from kimi_server.http.connections import BODY_TIMED_OUT
from kimi_server.http.credentials import presented
from kimi_server.http.disconnect import ClientGone
from kimi_server.http.errors import send_error
from kimi_server.http.json_checks import NOT_PARSED, check_json
from kimi_server.http.routes import UPLOADS, key_needed
from kimi_server.policy.prompt_size import PromptLimits
from kimi_server.settings import Settings

PARSED_BODY = "kimi.parsed_body"  # scope key: the JSON body as json.loads gave it
KeyCheck = Callable[[str | None], Awaitable[Principal]]  # an Authorization header → its principal


class OverloadGuard:
    def __init__(self, app: ASGIApp, *, check_key: KeyCheck, throttle: AuthThrottle, settings: Settings) -> None:
        self.app = app
        self.check_key = check_key  # static keys, then stored keys where the gateway is on
        self.throttle = throttle  # failed keys are counted, slowed, then refused (gate/auth_throttle.py)
        # None: the admin API is off (it lives in the gateway's store).
        self.admin_key = settings.admin_key if settings.gateway_enabled else None
        self.max_depth = settings.max_json_depth
        self.max_messages = PromptLimits.from_settings(settings).max_messages

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self._handle(scope, receive, send)

    async def _handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = dict(scope.get("headers") or ())
        path = scope.get("path", "")
        has_body = headers.get(b"content-length", b"0") not in (b"0", b"") or b"transfer-encoding" in headers
        refusal = await self._authenticate(scope, path, presented(headers))
        if refusal is not None:
            # Checked before the body is read; an unread body ends the connection.
            await send_error(send, refusal, close=has_body, path=path)
            return
        if not has_body:
            await self.app(scope, receive, send)
            return
        if scope.get("method") != "POST" or key_needed(path) is None or path in UPLOADS:
            # A body this guard does not check (a keyless route's, an upload) is not read here:
            # if the route leaves it unread too, the answer ends the connection.
            closing_receive, closing_send = _closing_if_unread(receive, send)
            await self.app(scope, closing_receive, closing_send)
            return
        body = await read_body(receive)
        if body is None:
            # The client left, or its body came too slowly and the connection already got its
            # 408 (http/connections.py). Nobody reads this answer: it is for the request log.
            ended: APIError = ClientGone()
            if scope.get(BODY_TIMED_OUT):
                ended = RequestTimeoutError("The request body came too slowly.")
            await send_error(send, ended, close=True, path=path)
            return
        problem, parsed = check_json(body, path, max_depth=self.max_depth, max_messages=self.max_messages)
        if problem is not None:
            await send_error(send, problem, path=path)
            return
        if parsed is not NOT_PARSED:
            scope[PARSED_BODY] = parsed  # for http/direct.py: the body is parsed once
        await self.app(scope, _replay(body, receive), send)

    async def _authenticate(self, scope: Scope, path: str, authorization: str | None) -> APIError | None:
        """Why this request may not go on, decided on its head alone; None if it may (the
        principal of an API key is then on the request's record). Failures are throttled."""
        needed = key_needed(path)
        token = bearer_token(authorization)
        if needed == "admin":
            return await self.throttle.screen(scope, token, "admin", lambda: self._admin(authorization))
        if needed == "tenant":
            return await self.throttle.screen(scope, token, "api", lambda: self._tenant(scope, authorization))
        return None

    async def _admin(self, authorization: str | None) -> APIError | None:
        return await as_counted(admin_key_refusal(self.admin_key, authorization), authorization, self.check_key)

    async def _tenant(self, scope: Scope, authorization: str | None) -> APIError | None:
        try:
            request_record(scope).principal = await self.check_key(authorization)
        except AuthenticationError as exc:
            return exc
        return None


async def read_body(receive: Receive) -> bytes | None:
    """The whole body; None if the connection ended first."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _closing_if_unread(receive: Receive, send: Send) -> tuple[Receive, Send]:
    """Adds ``Connection: close`` to an answer sent before the body was read to its end: the
    rest of it is never read, so the connection cannot serve another request."""
    finished = False

    async def tracking_receive() -> Message:
        nonlocal finished
        message = await receive()
        finished = finished or message["type"] != "http.request" or not message.get("more_body", False)
        return message

    async def closing_send(message: Message) -> None:
        if message["type"] == "http.response.start" and not finished:
            message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
        await send(message)

    return tracking_receive, closing_send


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
