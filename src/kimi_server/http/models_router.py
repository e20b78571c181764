"""``GET /v1/models`` and ``GET /v1/models/{id}``, and the unauthenticated ``GET /health``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from kimi_server.engines.base import PromptAsker, PromptCounter
from kimi_server.engines.upstream.build import single_upstream
from kimi_server.errors import NotFoundError
from kimi_server.gate.auth import Principal
from kimi_server.gate.queues import tenant_engine_stats
from kimi_server.http.anthropic_models_router import list_models as anthropic_models
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
    engine = engines.for_model(spec.id)
    window = engine.context_length()
    if window is not None:
        model["context_length"] = window
    # The operator's bound on one prompt, often far below the window: a client must see it too.
    if isinstance(engine, PromptCounter) and (bound := engine.prompt_token_limit()) is not None:
        model["max_prompt_tokens"] = min(bound, window) if window is not None else bound
    # The output cap this caller's requests get when they name none (the key's, else the model's).
    model["default_max_output_tokens"] = output_defaults[spec.id]
    # Whether count_tokens and admission count a prompt as the engine bills it, or bound it.
    exact = isinstance(engine, PromptCounter | PromptAsker) and engine.counts_exactly()
    model["capabilities"] = {**_capabilities(settings, spec.id), "exact_token_count": exact}
    # The efforts it takes (and the other spellings mapped onto them), so a client can check a
    # choice before sending a turn with it.
    model["reasoning_efforts"] = list(spec.efforts)
    model["reasoning_effort_aliases"] = {k: v for k, v in spec.effort_aliases.items() if v in spec.efforts}
    model["default_reasoning_effort"] = spec.default_effort
    return model


def _capabilities(settings: Settings, model_id: str) -> dict[str, bool]:
    """What a client (or ``kimi-server verify``) may count on: ``prompt_cache``, whether answers
    report prompt-cache reads. An upstream route only when every upstream declares it, since a
    request may land on any of them."""
    single = single_upstream(settings)
    route = settings.routes.get(model_id)
    if single is not None:
        upstreams = [single]
    elif route is not None and route.engine == "upstream":
        upstreams = route.upstreams
    else:
        return {"prompt_cache": settings.cache_enabled}
    return {"prompt_cache": all(up.capabilities.prompt_cache for up in upstreams)}


@router.get("/v1/models", tags=["Models"], responses=UNAUTHORIZED)
async def list_models(request: Request, principal: Principal = Depends(authenticated)) -> dict[str, Any]:
    if "anthropic-version" in request.headers:  # an Anthropic SDK given this server's root
        return await anthropic_models(request, principal=principal)
    state = app_state(request)
    engines = state.engines
    served = engines.served()
    if principal.record is not None:  # a key limited to some models, or in a team that is
        served = frozenset(m for m in served if principal.record.allows(m))
    caps = output_defaults(state.settings, principal.output_cap)
    return {"object": "list", "data": [_model(s, engines, caps, state.settings) for s in CATALOGUE if s.id in served]}


@router.get("/v1/models/{model_id}", tags=["Models"], responses={**UNAUTHORIZED, 404: {"model": ErrorBody}})
async def retrieve_model(
    model_id: str, request: Request, principal: Principal = Depends(authenticated)
) -> dict[str, Any]:
    state = app_state(request)
    engines = state.engines
    served = engines.served()
    if principal.record is not None:  # a key limited to some models, or in a team that is
        served = frozenset(m for m in served if principal.record.allows(m))
    for spec in CATALOGUE:
        if spec.id == model_id and spec.id in served:
            return _model(spec, engines, output_defaults(state.settings, principal.output_cap), state.settings)
    raise NotFoundError(f"The model '{model_id}' does not exist.", param="model")


@router.get("/v1/engine/stats", tags=["Operations"], responses=UNAUTHORIZED)
async def engine_stats(request: Request, principal: Principal = Depends(authenticated)) -> dict[str, Any]:
    """Per engine, the caller's own counters: its generation calls in flight, calls cancelled by
    its client leaving, and its requests admitted, waiting and refused (server-wide totals are
    for operators: ``gate/queues.py:server_totals``)."""
    return {"object": "list", "data": tenant_engine_stats(app_state(request).queues, principal.key_id)}


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
