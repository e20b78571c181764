"""The project's own error types.

Code below the HTTP layer raises only these; ``http.errors`` renders each one the same way
whether the response is plain JSON or an already-started SSE stream.

    APIError
     ├── InvalidRequestError      400  a field is wrong (``param`` names it)
     ├── AuthenticationError      401
     ├── PermissionDeniedError    403
     ├── NotFoundError            404
     ├── RequestTimeoutError      408  the body came too slowly
     ├── PayloadTooLargeError     413
     ├── RateLimitError           429
     ├── EngineUnavailableError   503
     └── InternalServerError      500  never carries internals
"""

from __future__ import annotations


class APIError(Exception):
    status_code = 500
    error_type = "server_error"
    default_code: str | None = "internal_error"

    def __init__(
        self, message: str, *, param: str | None = None, code: str | None = None, retry_after: int | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code if code is not None else self.default_code
        self.retry_after = retry_after  # seconds, sent as Retry-After (429s and 503s)

    def to_body(self) -> dict[str, object]:
        error: dict[str, object] = {
            "message": self.message,
            "type": self.error_type,
            "code": self.code,
        }
        if self.param is not None:
            error["param"] = self.param
        return {"error": error}


class InvalidRequestError(APIError):
    status_code = 400
    error_type = "invalid_request_error"
    default_code = "invalid_request"


class AuthenticationError(APIError):
    status_code = 401
    error_type = "authentication_error"
    default_code = "invalid_api_key"


class PermissionDeniedError(APIError):
    status_code = 403
    error_type = "permission_error"
    default_code = "permission_denied"


class NotFoundError(APIError):
    status_code = 404
    error_type = "not_found_error"
    default_code = "model_not_found"


class RequestTimeoutError(APIError):
    status_code = 408
    error_type = "invalid_request_error"
    default_code = "request_timeout"


class PayloadTooLargeError(APIError):
    status_code = 413
    error_type = "invalid_request_error"
    default_code = "request_too_large"


class RateLimitError(APIError):
    status_code = 429
    error_type = "rate_limit_error"
    default_code = "rate_limit_exceeded"


class EngineUnavailableError(APIError):
    status_code = 503
    error_type = "server_error"
    default_code = "engine_unavailable"


class InternalServerError(APIError):
    status_code = 500
    error_type = "server_error"
    default_code = "internal_error"

    def __init__(self, message: str = "The server had an error while processing the request.") -> None:
        super().__init__(message)
