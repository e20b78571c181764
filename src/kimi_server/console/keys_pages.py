"""Keys (the admin key only): list, create (the secret shown once), edit, rotate, revoke.

Every change goes through the admin API's own route functions (``http/admin_router.py``),
with the same request models, checks and errors as ``/admin/v1/keys``, and is recorded in the
audit trail as this console session's.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from starlette.responses import RedirectResponse, Response

from kimi_server.console import key_forms
from kimi_server.console.session import Viewer, admin_viewer, console_actor, csrf_ok
from kimi_server.console.web import Form, error_text, one, page, read_form
from kimi_server.errors import APIError, InvalidRequestError
from kimi_server.gate.gateway import Gateway
from kimi_server.http import admin_router
from kimi_server.http.admin_router import KeyRotate
from kimi_server.http.state import app_state

router = APIRouter(prefix="/console/keys", include_in_schema=False)
# Shown in the list beside what every key has; the rest of a key's fields are on its page.
KNOWN = {
    "id",
    "object",
    "name",
    "status",
    "rpm",
    "tpm",
    "budget_usd",
    "spent_usd",
    "models",
    "max_output_tokens",
    "created_at",
    "expires_at",
    "revoked_at",
    "team",
    "tags",
}


def _gateway(request: Request) -> Gateway:
    gw = app_state(request).gateway
    assert gw is not None  # an admin viewer exists only with the gateway on
    return gw


def served_models(request: Request) -> list[str]:
    """The model ids a key may be limited to (the same list the admin API checks against)."""
    return sorted(_gateway(request).keys.rules.known)


async def _context(request: Request, **extra: Any) -> dict[str, Any]:
    teams = [t.as_dict() for t in await _gateway(request).teams.list()]
    return {
        "fields": key_forms.form_fields(),
        "served": served_models(request),
        "known": KNOWN,
        "teams": teams,
        **extra,
    }


async def _listing(request: Request, who: Viewer, status: int = 200, **extra: Any) -> Response:
    keys = (await admin_router.list_keys(_gateway(request)))["data"]
    return page(request, "keys.html", who, status=status, keys=keys, form={}, **await _context(request, **extra))


@router.get("")
async def list_keys(request: Request, who: Viewer = Depends(admin_viewer)) -> Response:
    return await _listing(request, who)


@router.post("")
async def create_key(request: Request, who: Viewer = Depends(admin_viewer)) -> Response:
    form = await read_form(request)
    if not csrf_ok(who, one(form, "csrf")):
        return page(request, "denied.html", who, status=403, reason="The form expired: reload the page.")
    try:
        made = await admin_router.create_key(
            key_forms.create_body(form), _gateway(request), console_actor(request, who)
        )
    except APIError as exc:
        keys = (await admin_router.list_keys(_gateway(request)))["data"]
        return page(
            request,
            "keys.html",
            who,
            status=exc.status_code,
            keys=keys,
            error=error_text(exc),
            form={k: v[0] for k, v in form.items() if v} | {"models": form.get("models", [])},
            **await _context(request),
        )
    secret = made.pop("secret")
    return page(request, "key_created.html", who, key=made, secret=secret)


async def _edit_page(request: Request, who: Viewer, key: str, status: int = 200, **extra: Any) -> Response:
    record = await admin_router.show_key(key, _gateway(request))
    return page(
        request,
        "key_edit.html",
        who,
        status=status,
        key=record,
        expiry=key_forms.expiry_input(record),
        **await _context(request, **extra),
    )


@router.get("/{key}")
async def show_key(request: Request, key: str, who: Viewer = Depends(admin_viewer)) -> Response:
    try:
        return await _edit_page(request, who, key)
    except APIError as exc:
        return page(request, "denied.html", who, status=exc.status_code, reason=error_text(exc))


@router.post("/{key}")
async def update_key(request: Request, key: str, who: Viewer = Depends(admin_viewer)) -> Response:
    form = await read_form(request)
    if not csrf_ok(who, one(form, "csrf")):
        return page(request, "denied.html", who, status=403, reason="The form expired: reload the page.")
    gw = _gateway(request)
    actor = console_actor(request, who)
    try:
        before = await admin_router.show_key(key, gw)
        action = one(form, "action")
        if action == "revoke":
            await admin_router.revoke_key(key, gw, actor)
            return RedirectResponse(f"/console/keys/{before['id']}?revoked=1", status_code=303)
        if action == "rotate":
            made = await admin_router.rotate_key(key, _rotation(form), gw, actor)
            secret = made.pop("secret")
            return page(request, "key_created.html", who, key=made, secret=secret, rotated=True)
        await admin_router.update_key(key, key_forms.update_body(form, before), gw, actor)
    except APIError as exc:
        try:
            return await _edit_page(request, who, key, status=exc.status_code, error=error_text(exc))
        except APIError:
            return page(request, "denied.html", who, status=exc.status_code, reason=error_text(exc))
    return RedirectResponse(f"/console/keys/{before['id']}?saved=1", status_code=303)


def _rotation(form: Form) -> KeyRotate:
    raw = one(form, "grace_seconds") or "0"
    if not raw.isdigit():
        raise InvalidRequestError("'grace_seconds' must be a whole number of seconds.", param="grace_seconds")
    return key_forms.validated(KeyRotate, {"grace_seconds": int(raw)})  # type: ignore[no-any-return]
