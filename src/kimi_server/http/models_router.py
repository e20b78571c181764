"""``GET /v1/models`` and ``GET /v1/models/{id}``, and the unauthenticated ``GET /health``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from kimi_server.errors import NotFoundError
from kimi_server.gate.auth import Principal
from kimi_server.http.overload import tenant_engine_stats
from kimi_server.http.state import app_state, authenticated
from kimi_server.policy.catalogue import CATALOGUE, ModelSpec
from kimi_server.policy.output_caps import output_defaults
from kimi_server.policy.profiles import contract_for
from kimi_server.protocol.common import ErrorBody
from kimi_server.serving.common import EngineSet
from kimi_server.settings import Settings

router = APIRouter()
UNAUTHORIZED: dict[int | str, dict[str, Any]] = {401: {"model": ErrorBody}}


def _model(spec: ModelSpec, engines: EngineSet, output_defaults: dict[str, int], settings: Settings) -> dict[str, Any]:
    model: dict[str, Any] = {"id": spec.id, "object": "model", "created": spec.created, "owned_by": spec.owned_by}
    # Whose API rules this model follows (policy/profiles.py): a client can tell what to send.
    model["contract"] = contract_for(settings, spec.id).name
    # The window this server really gives (the engine's ctx_size), not the hosted one.
    window = engines.for_model(spec.id).context_length()
    if window is not None:
        model["context_length"] = window
    # The output cap this caller's requests get when they name none (the key's, else the model's).
    model["default_max_output_tokens"] = output_defaults[spec.id]
    return model


@router.get("/v1/models", tags=["Models"], responses=UNAUTHORIZED)
async def list_models(request: Request, principal: Principal = Depends(authenticated)) -> dict[str, Any]:
    state = app_state(request)
    engines = state.engines
    served = engines.served()
    if principal.record is not None and principal.record.models is not None:
        served = served & principal.record.models
    caps = output_defaults(state.settings, principal.output_cap)
    return {"object": "list", "data": [_model(s, engines, caps, state.settings) for s in CATALOGUE if s.id in served]}


@router.get("/v1/models/{model_id}", tags=["Models"], responses={**UNAUTHORIZED, 404: {"model": ErrorBody}})
async def retrieve_model(
    model_id: str, request: Request, principal: Principal = Depends(authenticated)
) -> dict[str, Any]:
    state = app_state(request)
    engines = state.engines
    served = engines.served()
    if principal.record is not None and principal.record.models is not None:
        served = served & principal.record.models
    for spec in CATALOGUE:
        if spec.id == model_id and spec.id in served:
            return _model(spec, engines, output_defaults(state.settings, principal.output_cap), state.settings)
    raise NotFoundError(f"The model '{model_id}' does not exist.", param="model")


@router.get("/v1/engine/stats", tags=["Operations"], responses=UNAUTHORIZED)
async def engine_stats(request: Request, principal: Principal = Depends(authenticated)) -> dict[str, Any]:
    """Per engine, the caller's own counters: its generation calls in flight, calls cancelled by
    its client leaving, and its requests admitted, waiting and refused (server-wide totals are
    for operators: ``http/overload.py:server_totals``)."""
    return {"object": "list", "data": tenant_engine_stats(request.app, principal.key_id)}


@router.head("/health", include_in_schema=False)  # probes that send HEAD
@router.get("/health", tags=["Health"])
async def health(request: Request, deep: bool = False) -> dict[str, Any]:
    """Liveness; the only route that needs no key. ``?deep=1`` (with a key): the model and each
    upstream, each asked for one token."""
    if deep:
        from kimi_server.http.upstream_health import deep_health

        state = app_state(request)
        await authenticated(request)
        return await deep_health(state.engines)
    return {"status": "ok"}
