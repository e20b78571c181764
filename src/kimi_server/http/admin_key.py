"""Who may use the admin API: the admin key only, checked before any body is read."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable

from kimi_server.errors import APIError, AuthenticationError, PermissionDeniedError
from kimi_server.gate.auth import Principal
from kimi_server.gate.auth_throttle import NotTheAdminKey
from kimi_server.gate.key_hash import digest

ADMIN_KEY_ID = "admin"  # the admin key as the request log line names its caller


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer TOKEN`` header; None for any other header."""
    scheme, _, token = (authorization or "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def is_admin_key(token: str, admin_key: str | None) -> bool:
    """Compared as digests in constant time, so the comparison says nothing about the key."""
    return bool(admin_key) and hmac.compare_digest(digest(token), digest(admin_key or ""))


def admin_key_refusal(admin_key: str | None, authorization: str | None) -> APIError | None:
    """Why a request with this ``Authorization`` header may not use the admin API, or None.

    ``admin_key`` None means the admin API is off (no key configured, or no gateway)."""
    token = bearer_token(authorization)
    if token is None:
        return AuthenticationError("The admin API needs the admin key as 'Authorization: Bearer ADMIN_KEY'.")
    if not admin_key:
        return PermissionDeniedError("The admin API is off: start the server with --admin-key or KIMI_ADMIN_KEY.")
    if not is_admin_key(token, admin_key):
        return PermissionDeniedError("This key may not use the admin API.")
    return None


async def as_counted(
    refusal: APIError | None, authorization: str | None, check_key: Callable[[str | None], Awaitable[Principal]]
) -> APIError | None:
    """``refusal`` as the throttle should count it: a valid API key refused where the admin key
    is needed is ``NotTheAdminKey``, no guess (gate/auth_throttle.py)."""
    if not isinstance(refusal, PermissionDeniedError):
        return refusal
    try:
        await check_key(authorization)
    except AuthenticationError:
        return refusal
    return NotTheAdminKey(refusal.message)
