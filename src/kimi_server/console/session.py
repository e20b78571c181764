"""Console sessions: who is signed in, kept in one sealed, HttpOnly, SameSite=Strict cookie.

The cookie holds the key the person signed in with, an expiry and a CSRF token,
sealed with AES-256-GCM under ``console_key_file`` (``<data_dir>/console.key``, made on first start):
nobody without that file can read or forge it, and every worker of ``serve --workers N``
opens it alike, with no session table to share. The key is checked again on every request,
so a revoked or expired key loses the console at once. Replacing that file signs
everyone out.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import secrets
import time
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from fastapi import Request
from starlette.responses import Response

from kimi_server.errors import AuthenticationError
from kimi_server.gate.audit import Actor, client_host
from kimi_server.gate.auth import Principal
from kimi_server.gate.request_record import request_record
from kimi_server.http.admin_key import ADMIN_KEY_ID, is_admin_key
from kimi_server.http.state import app_state

COOKIE = "kimi_console"
LOGIN_COOKIE = "kimi_console_login"  # the sign-in form's own CSRF token, before any session
COOKIE_PATH = "/console"
LIFETIME = 12 * 3600  # seconds a sign-in lasts
_AAD = b"kimi-console-session-v1"


class NotSignedIn(Exception):
    """Raised by ``viewer``; the console answers with the sign-in page."""


class AdminOnly(Exception):
    """A tenant key asked for an operator's page."""


@dataclass(frozen=True)
class Viewer:
    admin: bool
    key: str  # the key signed in with: used for the playground's calls, never rendered
    csrf: str
    principal: Principal | None = None  # for a tenant key

    @property
    def key_id(self) -> str | None:
        return self.principal.key_id if self.principal is not None else None


class Sealer:
    def __init__(self, key: bytes) -> None:
        self._aead = AESGCM(key)

    def seal(self, payload: dict[str, object]) -> str:
        nonce = secrets.token_bytes(12)
        blob = nonce + self._aead.encrypt(nonce, json.dumps(payload).encode(), _AAD)
        return base64.urlsafe_b64encode(blob).decode().rstrip("=")

    def open(self, token: str) -> dict[str, object] | None:
        try:
            blob = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
            data = json.loads(self._aead.decrypt(blob[:12], blob[12:], _AAD))
        except (InvalidTag, ValueError, binascii.Error):
            return None
        return data if isinstance(data, dict) else None


def console_sealer(request: Request) -> Sealer:
    sealer: Sealer = request.app.state.kimi_console_sealer
    return sealer


async def check_key(request: Request, key: str) -> Viewer | None:
    """The viewer this key signs in as: the admin key (with the admin API on), or any key the
    API accepts; None for any other text."""
    state = app_state(request)
    csrf = secrets.token_urlsafe(24)
    if state.gateway is not None and is_admin_key(key, state.settings.admin_key):
        return Viewer(admin=True, key=key, csrf=csrf)
    authorization = f"Bearer {key}"
    try:
        if state.gateway is not None:
            principal = await state.gateway.principal(state.keys, authorization)
        else:
            principal = state.keys.authenticate(authorization)
    except AuthenticationError:
        return None
    return Viewer(admin=False, key=key, csrf=csrf, principal=principal)


def start_session(request: Request, response: Response, who: Viewer) -> None:
    payload = {"k": who.key, "c": who.csrf, "x": int(time.time()) + LIFETIME}
    token = console_sealer(request).seal(payload)
    response.set_cookie(
        COOKIE,
        token,
        max_age=LIFETIME,
        path=COOKIE_PATH,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


def end_session(response: Response) -> None:
    response.delete_cookie(COOKIE, path=COOKIE_PATH, httponly=True, samesite="strict")


async def current_viewer(request: Request) -> Viewer | None:
    token = request.cookies.get(COOKIE)
    data = console_sealer(request).open(token) if token else None
    if data is None:
        return None
    key, csrf, expires = data.get("k"), data.get("c"), data.get("x")
    if not isinstance(key, str) or not isinstance(csrf, str) or not isinstance(expires, int):
        return None
    if expires < time.time():
        return None
    who = await check_key(request, key)  # revoked or expired since sign-in: signed out
    if who is None:
        return None
    return Viewer(admin=who.admin, key=key, csrf=csrf, principal=who.principal)


async def viewer(request: Request) -> Viewer:
    """Dependency for every console page but sign-in. The request's log line names the key."""
    who = await current_viewer(request)
    if who is None:
        raise NotSignedIn
    request_record(request.scope).key_id = who.key_id or ADMIN_KEY_ID
    return who


def signed_in_as(who: Viewer) -> str:
    """How a session signed in, as the audit trail names it (never the key itself)."""
    return "admin key" if who.admin else f"key {who.key_id}"


def console_actor(request: Request, who: Viewer) -> Actor:
    """A console session as the audit trail records it, with the browser's address."""
    return Actor("console", f"console session ({signed_in_as(who)})", client_host(request.scope))


async def admin_viewer(request: Request) -> Viewer:
    who = await viewer(request)
    if not who.admin:
        raise AdminOnly
    return who


def csrf_ok(who: Viewer, sent: str | None) -> bool:
    return sent is not None and hmac.compare_digest(who.csrf.encode(), sent.encode())
