"""Errors an upstream can cause, in the API's error shape. Messages never carry upstream URLs,
keys or bodies beyond a short, scrubbed reason."""

from __future__ import annotations

from kimi_server.errors import APIError


class BadGatewayError(APIError):
    status_code = 502
    error_type = "server_error"
    default_code = "upstream_error"


class UpstreamUnavailableError(APIError):
    status_code = 503
    error_type = "server_error"
    default_code = "upstream_unavailable"


class GatewayTimeoutError(APIError):
    status_code = 504
    error_type = "server_error"
    default_code = "upstream_timeout"


class UpstreamRateLimitError(APIError):
    status_code = 429
    error_type = "rate_limit_error"
    default_code = "rate_limit_exceeded"


class UpstreamStreamError(BadGatewayError):
    """The upstream's stream broke after output had begun: malformed, truncated or stalled."""


class MissingToolCallError(BadGatewayError):
    """A ``tool_choice`` of "required" or a named function, and the upstream's answer (asked
    again under a JSON Schema where it takes one) held no such call."""

    default_code = "upstream_no_tool_call"
