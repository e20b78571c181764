"""Security headers on every answer under ``/console`` (pages, fragments, redirects, static files).

The Content-Security-Policy lets a page run only the console's own script files (no inline
script or handler, nothing from elsewhere, no ``eval``), load only its own styles and images,
talk only to this server, post forms only here, and be framed by nobody. The templates and
``static/*.js`` are written for it: handlers live in the files, and htmx is told not to add its
inline style (``base.html``).
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kimi_server.http.routes import CONSOLE

POLICY = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",  # data: for the empty favicon, so browsers ask for none
        "connect-src 'self'",
        "form-action 'self'",
        "frame-ancestors 'none'",
        "base-uri 'none'",
    )
)
HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-security-policy", POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),  # frame-ancestors for browsers that predate it
)
_NAMES = {name for name, _ in HEADERS}


def is_console(path: str) -> bool:
    return path == CONSOLE or path.startswith(CONSOLE + "/")


class ConsoleHeaders:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not is_console(scope.get("path", "")):
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                kept = [(k, v) for k, v in message.get("headers", []) if k.lower() not in _NAMES]
                message = {**message, "headers": [*kept, *HEADERS]}
            await send(message)

        await self.app(scope, receive, send_with_headers)
