"""Sign-in, sign-out, and where ``/`` and ``/console`` lead."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from starlette.responses import JSONResponse, RedirectResponse, Response

from kimi_server import __version__
from kimi_server.console.login_token import LoginTokens
from kimi_server.console.session import (
    COOKIE_PATH,
    LOGIN_COOKIE,
    Viewer,
    check_key,
    console_actor,
    csrf_ok,
    current_viewer,
    end_session,
    start_session,
    viewer,
)
from kimi_server.console.web import one, page, read_form
from kimi_server.errors import APIError, AuthenticationError, RateLimitError
from kimi_server.gate import audit
from kimi_server.gate.audit import Actor, client_host
from kimi_server.gate.request_record import request_record
from kimi_server.http.admin_key import ADMIN_KEY_ID
from kimi_server.http.state import app_state

router = APIRouter(include_in_schema=False)


@router.get("/")
async def root(request: Request) -> Response:
    """A browser goes to the console; anything else learns where things are."""
    if "text/html" in request.headers.get("accept", ""):
        return RedirectResponse("/console/", status_code=303)
    body: dict[str, Any] = {
        "name": "kimi-server",
        "version": __version__,
        "console": "/console/",
        "api": "/v1",
        "health": "/health",
    }
    return JSONResponse(body)


@router.get("/console")
@router.get("/console/")
async def home(who: Viewer = Depends(viewer)) -> Response:
    return RedirectResponse("/console/keys" if who.admin else "/console/me", status_code=303)


def _login_page(request: Request, error: str | None = None, status: int = 200) -> Response:
    nonce, token = login_tokens(request).issue()
    response = page(request, "login.html", None, status=status, login_csrf=token, error=error)
    response.set_cookie(
        LOGIN_COOKIE, nonce, path=COOKIE_PATH, httponly=True, samesite="strict", secure=request.url.scheme == "https"
    )
    return response


def login_tokens(request: Request) -> LoginTokens:
    tokens: LoginTokens = request.app.state.kimi_console_login
    return tokens


@router.get("/console/login")
async def login_form(request: Request) -> Response:
    if await current_viewer(request) is not None:
        return RedirectResponse("/console/", status_code=303)
    return _login_page(request)


@router.post("/console/login")
async def login(request: Request) -> Response:
    form = await read_form(request)
    if not login_tokens(request).valid(request.cookies.get(LOGIN_COOKIE), one(form, "csrf")):
        return _login_page(request, "The sign-in form expired. Try again.", status=400)
    key = one(form, "key")
    signed_in: list[Viewer] = []

    async def check() -> APIError | None:
        who = await check_key(request, key)
        if who is None:
            return AuthenticationError("That key is not valid here.")
        signed_in.append(who)
        return None

    # Wrong keys here count with those sent to the API (gate/auth_throttle.py).
    refusal = await app_state(request).throttle.screen(request.scope, key or None, "console", check)
    if isinstance(refusal, RateLimitError):
        # Not recorded: a locked address is refused at once, so each would be a free row.
        response = _login_page(request, refusal.message, status=429)
        response.headers["retry-after"] = str(refusal.retry_after)
        return response
    if refusal is not None:
        anyone = Actor("console", "unknown key", client_host(request.scope))
        await _audit(request, anyone, "console.sign_in_failed", {"reason": "the key is not valid here"})
        return _login_page(request, refusal.message, status=401)
    who = signed_in[0]
    request_record(request.scope).key_id = who.key_id or ADMIN_KEY_ID  # the log line names who signed in
    await _audit(request, console_actor(request, who), "console.sign_in", {})
    response = RedirectResponse("/console/", status_code=303)
    start_session(request, response, who)
    response.delete_cookie(LOGIN_COOKIE, path=COOKIE_PATH)
    return response


@router.post("/console/logout")
async def logout(request: Request, who: Viewer = Depends(viewer)) -> Response:
    form = await read_form(request)
    if not csrf_ok(who, one(form, "csrf")):
        return page(request, "denied.html", who, status=403, reason="The form expired: reload the page.")
    await _audit(request, console_actor(request, who), "console.sign_out", {})
    response = RedirectResponse("/console/login", status_code=303)
    end_session(response)
    return response


async def _audit(request: Request, actor: Actor, action: str, details: dict[str, Any]) -> None:
    """Sign-ins go to the audit trail where there is one (the gateway's database)."""
    gateway = app_state(request).gateway
    if gateway is not None:
        await audit.record(gateway.db, actor, action, None, details)
