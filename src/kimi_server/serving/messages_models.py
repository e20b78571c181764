"""``GET /v1/models`` on the Messages door, in Anthropic's list shape.

Each served model, then each alias whose model is served (clients that ask for their own default
ids find them listed). Pages follow Anthropic's ``limit`` / ``after_id`` / ``before_id``.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from kimi_server.errors import InvalidRequestError, NotFoundError
from kimi_server.policy.catalogue import CATALOGUE, ModelSpec

DEFAULT_LIMIT = 20
MAX_LIMIT = 1000


def _info(model_id: str, spec: ModelSpec, display_name: str, window: int | None) -> dict[str, Any]:
    info: dict[str, Any] = {
        "type": "model",
        "id": model_id,
        "display_name": display_name,
        "created_at": datetime.fromtimestamp(spec.created, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "lifecycle": "active",
        "max_tokens": spec.max_output_tokens,
    }
    if window is not None:
        info["max_input_tokens"] = window
    return info


def models(
    served: frozenset[str], aliases: Mapping[str, str], windows: Mapping[str, int | None] | None = None
) -> list[dict[str, Any]]:
    """Every model id a client may name here. ``windows``: each served model's context length,
    where the engine knows it."""
    windows = windows or {}
    specs = {s.id: s for s in CATALOGUE if s.id in served}
    out = [_info(i, s, i, windows.get(i)) for i, s in specs.items()]
    for alias, target in aliases.items():
        if target in specs and alias not in specs:
            out.append(_info(alias, specs[target], f"{alias} (served by {target})", windows.get(target)))
    return out


def model_info(
    model_id: str, served: frozenset[str], aliases: Mapping[str, str], windows: Mapping[str, int | None] | None = None
) -> dict[str, Any]:
    """``GET /v1/models/{model_id}``."""
    for info in models(served, aliases, windows):
        if info["id"] == model_id:
            return info
    raise NotFoundError(f"The model '{model_id}' does not exist or you do not have access to it.", param="model_id")


def model_list(
    served: frozenset[str],
    aliases: Mapping[str, str],
    *,
    windows: Mapping[str, int | None] | None = None,
    limit: int = DEFAULT_LIMIT,
    after_id: str | None = None,
    before_id: str | None = None,
) -> dict[str, Any]:
    """The list answer: ``data``, ``has_more``, ``first_id``, ``last_id``."""
    if not 1 <= limit <= MAX_LIMIT:
        raise InvalidRequestError(f"'limit' must be between 1 and {MAX_LIMIT}; got {limit}.", param="limit")
    everything = models(served, aliases, windows)
    ids = [m["id"] for m in everything]
    if after_id is not None and before_id is not None:
        raise InvalidRequestError("Give 'after_id' or 'before_id', not both.", param="before_id")
    for name, value in (("after_id", after_id), ("before_id", before_id)):
        if value is not None and value not in ids:
            raise InvalidRequestError(f"'{name}' names no model in this list: {value[:60]!r}.", param=name)
    if after_id is not None:
        rest = everything[ids.index(after_id) + 1 :]
        page, more = rest[:limit], len(rest) > limit
    elif before_id is not None:
        rest = everything[: ids.index(before_id)]
        page, more = rest[-limit:], len(rest) > limit
    else:
        page, more = everything[:limit], len(everything) > limit
    return {
        "data": page,
        "has_more": more,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
    }
