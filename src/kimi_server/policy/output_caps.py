"""The output cap a request gets when it names none: the key's, else the operator's for that
model, else the catalogue's. A request's own cap always wins (up to the model's maximum)."""

from __future__ import annotations

from kimi_server.errors import InvalidRequestError
from kimi_server.policy.catalogue import CATALOGUE, ModelSpec
from kimi_server.settings import Settings

MAX_OUTPUT_TOKENS = max(spec.max_output_tokens for spec in CATALOGUE)


def check_output_cap(value: int | None, param: str = "max_output_tokens") -> int | None:
    if value is not None and not 1 <= value <= MAX_OUTPUT_TOKENS:
        raise InvalidRequestError(f"'{param}' must be between 1 and {MAX_OUTPUT_TOKENS}.", param=param)
    return value


def operator_default(settings: Settings, spec: ModelSpec) -> int:
    """The model's route's ``default_max_output_tokens``, else the top-level one, else the
    catalogue's; never above the model's maximum."""
    route = settings.routes.get(spec.id)
    chosen = route.default_max_output_tokens if route is not None else None
    if chosen is None:
        chosen = settings.default_max_output_tokens
    if chosen is None:
        chosen = spec.default_max_output_tokens
    return min(chosen, spec.max_output_tokens)


def output_defaults(settings: Settings, key_default: int | None) -> dict[str, int]:
    """Model id -> the cap a request from this key gets when it names none."""
    return {
        spec.id: min(key_default, spec.max_output_tokens)
        if key_default is not None
        else operator_default(settings, spec)
        for spec in CATALOGUE
    }
