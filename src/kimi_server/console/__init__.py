"""The operator's console at ``/console``: server-rendered pages (Jinja2, htmx, inline SVG),
signed in with the admin key or a tenant key. See docs/console.md."""

from __future__ import annotations

from fastapi import FastAPI
from starlette.staticfiles import StaticFiles

from kimi_server.console import (
    audit_pages,
    auth_pages,
    keys_pages,
    live_pages,
    playground,
    playground_files,
    requests_pages,
    teams_pages,
    usage_pages,
)
from kimi_server.console.headers import ConsoleHeaders
from kimi_server.console.login_token import LoginTokens
from kimi_server.console.session import Sealer
from kimi_server.console.web import HANDLERS, HERE
from kimi_server.serving.sealing import load_or_create_key


def install_console(app: FastAPI) -> None:
    settings = app.state.kimi.settings
    key_file = settings.console_key_file or settings.data_dir / "console.key"
    console_key = load_or_create_key(key_file)
    app.state.kimi_console_sealer = Sealer(console_key)
    app.state.kimi_console_login = LoginTokens(console_key)  # the sign-in form's CSRF token
    routers = (
        auth_pages.router,
        keys_pages.router,
        teams_pages.router,
        requests_pages.router,
        audit_pages.router,
        usage_pages.router,
        live_pages.router,
        playground.router,
        playground_files.router,
    )
    for router in routers:
        app.include_router(router)
    app.mount("/console/static", StaticFiles(directory=HERE / "static"), name="console-static")
    for kind, handler in HANDLERS.items():
        app.add_exception_handler(kind, handler)
    app.add_middleware(ConsoleHeaders)  # CSP, nosniff, referrer and framing on every console answer
