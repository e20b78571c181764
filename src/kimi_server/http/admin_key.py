"""Who may use the admin API: the admin key only, checked before any body is read."""

from __future__ import annotations

import hmac

from kimi_server.errors import APIError, AuthenticationError, PermissionDeniedError
from kimi_server.gate.auth import digest


def admin_key_refusal(admin_key: str | None, authorization: str | None) -> APIError | None:
    """Why a request with this ``Authorization`` header may not use the admin API, or None.

    ``admin_key`` None means the admin API is off (no key configured, or no gateway)."""
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return AuthenticationError("The admin API needs the admin key as 'Authorization: Bearer ADMIN_KEY'.")
    if not admin_key:
        return PermissionDeniedError("The admin API is off: start the server with --admin-key or KIMI_ADMIN_KEY.")
    if not hmac.compare_digest(digest(token.strip()), digest(admin_key)):
        return PermissionDeniedError("This key may not use the admin API.")
    return None
