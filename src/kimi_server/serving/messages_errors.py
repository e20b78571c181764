"""The project's errors in Anthropic's shape: ``{"type": "error", "error": {"type", "message"}}``.

Anthropic's error object has no ``param`` or ``code``: the field at fault is named in the
message itself (every message from ``errors.py`` callers already quotes it). The server's 503
(an engine overloaded, or the admission queue full) is Anthropic's 529 ``overloaded_error``,
which its clients retry.
"""

from __future__ import annotations

from typing import Any

from kimi_server.errors import APIError

# status -> (Anthropic's status, its error type)
_BY_STATUS: dict[int, tuple[int, str]] = {
    400: (400, "invalid_request_error"),
    401: (401, "authentication_error"),
    403: (403, "permission_error"),
    404: (404, "not_found_error"),
    408: (408, "timeout_error"),
    413: (413, "request_too_large"),
    429: (429, "rate_limit_error"),
    500: (500, "api_error"),
    502: (502, "api_error"),
    503: (529, "overloaded_error"),
    504: (504, "timeout_error"),
}


def anthropic_error(exc: APIError) -> tuple[int, dict[str, Any]]:
    """The HTTP status and body to answer ``exc`` with on the Messages door."""
    status, kind = _BY_STATUS.get(
        exc.status_code, (500, "api_error") if exc.status_code >= 500 else (400, "invalid_request_error")
    )
    message = exc.message
    if exc.param is not None and exc.param not in message:
        message = f"{message} (field: '{exc.param}')"
    return status, {"type": "error", "error": {"type": kind, "message": message}}
