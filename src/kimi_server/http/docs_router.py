"""The OpenAPI document and the page that browses it (Swagger UI, served from the package).

``/openapi.json`` needs an API key or the admin key unless ``public_docs`` is set. ``/docs`` and
its assets need none: they are the same static files in every install and hold no data; the page
asks for the key, fetches the document with it and puts it in Swagger's Authorize dialog
(``swagger/docs.js``).
"""

from __future__ import annotations

from html import escape
from importlib import resources
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, Response

from kimi_server.errors import NotFoundError
from kimi_server.gate.auth import Principal
from kimi_server.http.admin_key import bearer_token, is_admin_key
from kimi_server.http.routes import DOCS_ASSETS as ASSETS_PREFIX
from kimi_server.http.routes import DOCS_PAGE, key_needed
from kimi_server.http.state import app_state, authenticated

SWAGGER_UI_VERSION = "5.35.0"  # swagger/README.md says where the files come from
ASSETS = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "favicon-32x32.png": "image/png",
    "docs.js": "text/javascript; charset=utf-8",
}
# Two bearer schemes, so that Authorize holds both keys and each route sends the one it needs.
API_KEY_SCHEME = "APIKey"
ADMIN_KEY_SCHEME = "AdminKey"
SECURITY_SCHEMES = {
    API_KEY_SCHEME: {
        "type": "http",
        "scheme": "bearer",
        "description": "An API key: 'Authorization: Bearer sk-…'.",
    },
    ADMIN_KEY_SCHEME: {
        "type": "http",
        "scheme": "bearer",
        "description": "The admin key (the admin_key setting), for /admin/v1/.",
    },
}


async def docs_access(request: Request) -> Principal | None:
    """Who may read the document: anyone with ``public_docs``; else an API key (stored keys
    too) or the admin key, the two keys its Authorize dialog offers."""
    state = app_state(request)
    if state.settings.public_docs:
        return None
    token = bearer_token(request.headers.get("authorization"))
    if token is not None and state.gateway is not None and is_admin_key(token, state.settings.admin_key):
        return None
    return await authenticated(request)  # counted and slowed like any other wrong key


router = APIRouter(include_in_schema=False)


@router.get("/openapi.json", dependencies=[Depends(docs_access)])
async def openapi(request: Request) -> dict[str, Any]:
    schema: dict[str, Any] = request.app.openapi()
    return with_security(without_validation_errors(schema))


def without_validation_errors(schema: dict[str, Any]) -> dict[str, Any]:
    """Drops the 422 FastAPI advertises for every body: invalid input is a 400 here."""
    for path in schema.get("paths", {}).values():
        for operation in path.values():
            operation.get("responses", {}).pop("422", None)
    components = schema.get("components", {}).get("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        components.pop(name, None)
    return schema


def with_security(schema: dict[str, Any]) -> dict[str, Any]:
    """Says which key each route takes, which is what gives Swagger UI its Authorize button."""
    schema.setdefault("components", {})["securitySchemes"] = SECURITY_SCHEMES
    for path, operations in schema.get("paths", {}).items():
        needed = key_needed(path)  # the guard's own table
        if needed is None:
            continue
        scheme = ADMIN_KEY_SCHEME if needed == "admin" else API_KEY_SCHEME
        for operation in operations.values():
            operation["security"] = [{scheme: []}]
    return schema


@router.get(DOCS_PAGE)
async def swagger(request: Request) -> HTMLResponse:
    title = escape(f"{request.app.title} {request.app.version} - API")
    return HTMLResponse(PAGE.format(title=title, assets=ASSETS_PREFIX, version=SWAGGER_UI_VERSION))


@router.get(ASSETS_PREFIX + "{name}")
async def asset(name: str) -> Response:
    media_type = ASSETS.get(name)
    if media_type is None:
        raise NotFoundError("No such file.")
    body = resources.files("kimi_server.http").joinpath("swagger", name).read_bytes()
    # The file names carry no version: a browser checks back each hour.
    return Response(body, media_type=media_type, headers={"Cache-Control": "public, max-age=3600"})


PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<link rel="icon" type="image/png" href="{assets}favicon-32x32.png">
<link rel="stylesheet" href="{assets}swagger-ui.css?v={version}">
<style>
  #key-form {{ font-family: sans-serif; max-width: 40rem; margin: 2rem auto; }}
  #key-form input {{ width: 100%; padding: .5rem; font-family: monospace; }}
</style>
</head>
<body>
<form id="key-form" hidden>
  <h2>{title}</h2>
  <label for="key-input">This server's documentation needs an API key.</label>
  <p><input id="key-input" type="password" autocomplete="off" placeholder="sk-…" required></p>
  <button type="submit">Open the documentation</button>
  <p id="key-note" role="alert"></p>
  <p><small>The key stays in this browser tab (session storage) and goes only to this server.</small></p>
</form>
<div id="swagger-ui" data-openapi="/openapi.json"></div>
<script src="{assets}swagger-ui-bundle.js?v={version}"></script>
<script src="{assets}docs.js?v={version}"></script>
</body>
</html>
"""
