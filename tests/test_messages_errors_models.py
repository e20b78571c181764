"""The Messages door's errors in Anthropic's shape, and its model list, each read with the SDK's
own types."""

from __future__ import annotations

from datetime import datetime

import pytest
from anthropic.types import ModelInfo
from anthropic.types.shared import ErrorResponse

from kimi_server.errors import (
    APIError,
    AuthenticationError,
    EngineUnavailableError,
    InternalServerError,
    InvalidRequestError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    RateLimitError,
)
from kimi_server.serving.messages_errors import anthropic_error
from kimi_server.serving.messages_models import model_info, model_list, models
from tests.messages_util import ALIASES, SERVED


@pytest.mark.parametrize(
    ("error", "status", "kind"),
    [
        (
            InvalidRequestError("'max_tokens' must be between 1 and 1048576; got 0.", param="max_tokens"),
            400,
            "invalid_request_error",
        ),
        (AuthenticationError("Invalid API key."), 401, "authentication_error"),
        (PermissionDeniedError("This key may not use that model."), 403, "permission_error"),
        (NotFoundError("The model 'x' does not exist.", param="model"), 404, "not_found_error"),
        (PayloadTooLargeError("The request body is too large."), 413, "request_too_large"),
        (RateLimitError("Too many requests.", retry_after=3), 429, "rate_limit_error"),
        (InternalServerError(), 500, "api_error"),
        (EngineUnavailableError("The server is overloaded; retry shortly."), 529, "overloaded_error"),
    ],
)
def test_each_error_in_anthropics_shape(error: APIError, status: int, kind: str) -> None:
    got_status, payload = anthropic_error(error)
    assert got_status == status
    assert payload == {"type": "error", "error": {"type": kind, "message": error.message}}
    if kind != "request_too_large":  # Anthropic documents it; the SDK's union lacks the name
        ErrorResponse.model_validate(payload)


def test_the_field_is_named_in_the_message_when_the_message_does_not() -> None:
    _, payload = anthropic_error(InvalidRequestError("Must be a boolean.", param="tools[0].strict"))
    assert payload["error"]["message"] == "Must be a boolean. (field: 'tools[0].strict')"


def test_models_in_anthropics_list_shape() -> None:
    listed = model_list(SERVED, ALIASES, windows={"kimi-k3.1-pro": 32768})
    ids = [m["id"] for m in listed["data"]]
    assert ids == ["kimi-k3.1-pro", "kimi-k3.1-pro-highspeed", "kimi-k3", "claude-haiku-4-5", "claude-opus-4-1"]
    assert "claude-gone" not in ids  # an alias of a model not served
    assert listed["has_more"] is False and listed["first_id"] == ids[0] and listed["last_id"] == ids[-1]
    for entry in listed["data"]:
        info = ModelInfo.model_validate(entry)
        assert info.type == "model" and isinstance(info.created_at, datetime) and info.created_at.tzinfo is not None
    pro = listed["data"][0]
    assert pro["max_input_tokens"] == 32768 and "max_input_tokens" not in listed["data"][1]
    assert listed["data"][3]["display_name"] == "claude-haiku-4-5 (served by kimi-k3.1-pro-highspeed)"
    assert model_info("claude-haiku-4-5", SERVED, ALIASES)["id"] == "claude-haiku-4-5"
    with pytest.raises(NotFoundError):
        model_info("claude-gone", SERVED, ALIASES)


def test_model_list_pages() -> None:
    ids = [m["id"] for m in models(SERVED, ALIASES)]
    first = model_list(SERVED, ALIASES, limit=2)
    assert [m["id"] for m in first["data"]] == ids[:2] and first["has_more"]
    second = model_list(SERVED, ALIASES, limit=2, after_id=first["last_id"])
    assert [m["id"] for m in second["data"]] == ids[2:4] and second["has_more"]
    back = model_list(SERVED, ALIASES, limit=2, before_id=second["first_id"])
    assert [m["id"] for m in back["data"]] == ids[:2] and not back["has_more"]
    for bad, param in (
        ({"limit": 0}, "limit"),
        ({"after_id": "nope"}, "after_id"),
        ({"after_id": ids[0], "before_id": ids[1]}, "before_id"),
    ):
        with pytest.raises(InvalidRequestError) as caught:
            model_list(SERVED, ALIASES, **bad)
        assert caught.value.param == param
