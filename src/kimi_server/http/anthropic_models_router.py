"""``GET /anthropic/v1/models`` (and ``/v1/models`` for a client that sends ``anthropic-version``):
the models in Anthropic's list shape, the exact aliases among them."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from kimi_server.gate.auth import Principal
from kimi_server.http.generating import ERRORS
from kimi_server.http.routes import ANTHROPIC_MODELS
from kimi_server.http.state import app_state, authenticated
from kimi_server.serving.messages_models import model_info, model_list

router = APIRouter(tags=["Messages"])


async def list_models(
    request: Request,
    limit: int = 20,
    after_id: str | None = None,
    before_id: str | None = None,
    principal: Principal = Depends(authenticated),
) -> dict[str, Any]:
    """The models in Anthropic's list shape; aliases included."""
    served, aliases, windows = _catalogue(request, principal)
    return model_list(served, aliases, windows=windows, limit=limit, after_id=after_id, before_id=before_id)


async def retrieve_model(
    model_id: str, request: Request, principal: Principal = Depends(authenticated)
) -> dict[str, Any]:
    served, aliases, windows = _catalogue(request, principal)
    return model_info(model_id, served, aliases, windows)


def _catalogue(request: Request, principal: Principal) -> tuple[frozenset[str], dict[str, str], dict[str, int | None]]:
    state = app_state(request)
    served = state.engines.served()
    if principal.record is not None and principal.record.models is not None:
        served = served & principal.record.models
    # Patterns (claude-*) route requests; only exact aliases are ids a client can list.
    aliases = {a: t for a, t in state.settings.model_aliases.items() if not any(c in a for c in "*?[")}
    windows = {model: state.engines.for_model(model).context_length() for model in served}
    return served, aliases, windows


router.add_api_route(ANTHROPIC_MODELS, list_models, methods=["GET"], responses=ERRORS)
router.add_api_route(ANTHROPIC_MODELS + "/{model_id}", retrieve_model, methods=["GET"], responses=ERRORS)
