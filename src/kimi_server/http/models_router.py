"""``GET /v1/models`` and ``GET /v1/models/{id}``, and the unauthenticated ``GET /health``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from kimi_server.errors import NotFoundError
from kimi_server.http.state import app_state, authenticated
from kimi_server.policy.catalogue import CATALOGUE, ModelSpec
from kimi_server.serving.common import EngineSet

router = APIRouter()


def _model(spec: ModelSpec, engines: EngineSet) -> dict[str, Any]:
    return {
        "id": spec.id,
        "object": "model",
        "created": spec.created,
        "owned_by": spec.owned_by,
        # The window this server really gives (the engine's ctx_size), not the hosted one.
        "context_length": engines.for_model(spec.id).context_length(),
    }


@router.get("/v1/models", tags=["Models"], dependencies=[Depends(authenticated)])
async def list_models(request: Request) -> dict[str, Any]:
    engines = app_state(request).engines
    served = engines.served()
    return {"object": "list", "data": [_model(s, engines) for s in CATALOGUE if s.id in served]}


@router.get("/v1/models/{model_id}", tags=["Models"], dependencies=[Depends(authenticated)])
async def retrieve_model(model_id: str, request: Request) -> dict[str, Any]:
    engines = app_state(request).engines
    served = engines.served()
    for spec in CATALOGUE:
        if spec.id == model_id and spec.id in served:
            return _model(spec, engines)
    raise NotFoundError(f"The model '{model_id}' does not exist.", param="model")


@router.get("/v1/engine/stats", tags=["Operations"], dependencies=[Depends(authenticated)])
async def engine_stats(request: Request) -> dict[str, Any]:
    """Per-engine counters: generation calls in flight and calls cancelled by a client leaving."""
    engines = app_state(request).engines
    return {"object": "list", "data": [{"engine": e.name, **e.stats()} for e in engines.unique()]}


@router.get("/health", tags=["Health"])
async def health() -> dict[str, str]:
    """Liveness; the only route that needs no key."""
    return {"status": "ok"}
