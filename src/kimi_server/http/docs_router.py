"""OpenAPI schema and Swagger UI. Behind the API key unless ``public_docs`` is set."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse

from kimi_server.gate.auth import Principal
from kimi_server.http.state import app_state, authenticated


async def docs_access(request: Request) -> Principal | None:
    state = app_state(request)
    if state.settings.public_docs:
        return None
    return await authenticated(request)  # stored keys open the docs too


router = APIRouter(include_in_schema=False, dependencies=[Depends(docs_access)])


@router.get("/openapi.json")
async def openapi(request: Request) -> dict[str, Any]:
    schema: dict[str, Any] = request.app.openapi()
    return without_validation_errors(schema)


def without_validation_errors(schema: dict[str, Any]) -> dict[str, Any]:
    """Drops the 422 FastAPI advertises for every body: invalid input is a 400 here."""
    for path in schema.get("paths", {}).values():
        for operation in path.values():
            operation.get("responses", {}).pop("422", None)
    components = schema.get("components", {}).get("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        components.pop(name, None)
    return schema


@router.get("/docs")
async def swagger(request: Request) -> HTMLResponse:
    return get_swagger_ui_html(openapi_url="/openapi.json", title=f"{request.app.title} - docs")
