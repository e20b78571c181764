"""Sign-in, sign-out, and where ``/`` and ``/console`` lead."""

from __future__ import annotations

import hmac
import secrets
from typing import Any

from fastapi import APIRouter, Depends, Request
from starlette.responses import JSONResponse, RedirectResponse, Response

from kimi_server import __version__
from kimi_server.console.session import (
    COOKIE_PATH,
    LOGIN_COOKIE,
    Viewer,
    check_key,
    csrf_ok,
    current_viewer,
    end_session,
    start_session,
    viewer,
)
from kimi_server.console.web import one, page, read_form

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
    token = secrets.token_urlsafe(24)
    response = page(request, "login.html", None, status=status, login_csrf=token, error=error)
    response.set_cookie(
        LOGIN_COOKIE, token, path=COOKIE_PATH, httponly=True, samesite="strict", secure=request.url.scheme == "https"
    )
    return response


@router.get("/console/login")
async def login_form(request: Request) -> Response:
    if await current_viewer(request) is not None:
        return RedirectResponse("/console/", status_code=303)
    return _login_page(request)


@router.post("/console/login")
async def login(request: Request) -> Response:
    form = await read_form(request)
    expected = request.cookies.get(LOGIN_COOKIE, "")
    if not expected or not hmac.compare_digest(expected.encode(), one(form, "csrf").encode()):
        return _login_page(request, "The sign-in form expired. Try again.", status=400)
    who = await check_key(request, one(form, "key"))
    if who is None:
        return _login_page(request, "That key is not valid here.", status=401)
    response = RedirectResponse("/console/", status_code=303)
    start_session(request, response, who)
    response.delete_cookie(LOGIN_COOKIE, path=COOKIE_PATH)
    return response


@router.post("/console/logout")
async def logout(request: Request, who: Viewer = Depends(viewer)) -> Response:
    form = await read_form(request)
    if not csrf_ok(who, one(form, "csrf")):
        return page(request, "denied.html", who, status=403, reason="The form expired: reload the page.")
    response = RedirectResponse("/console/login", status_code=303)
    end_session(response)
    return response
