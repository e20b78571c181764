"""Teams (the admin key only): list, create, edit, delete; a team's page lists its keys.

Every change goes through the admin API's own route functions (``http/admin_teams_router.py``)
and is recorded in the audit trail as this console session's.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from starlette.responses import RedirectResponse, Response

from kimi_server.console import key_forms
from kimi_server.console.keys_pages import served_models
from kimi_server.console.session import Viewer, admin_viewer, console_actor, csrf_ok
from kimi_server.console.web import Form, error_text, one, page, read_form
from kimi_server.errors import APIError
from kimi_server.gate.gateway import Gateway
from kimi_server.http import admin_router, admin_teams_router
from kimi_server.http.state import app_state

router = APIRouter(prefix="/console/teams", include_in_schema=False)
EXPIRED = "The form expired: reload the page."


def _gateway(request: Request) -> Gateway:
    gw = app_state(request).gateway
    assert gw is not None  # an admin viewer exists only with the gateway on
    return gw


def _context(request: Request, **extra: Any) -> dict[str, Any]:
    return {"fields": key_forms.team_fields(), "served": served_models(request), **extra}


def _sent_back(form: Form) -> dict[str, Any]:
    return {k: v[0] for k, v in form.items() if v} | {"models": form.get("models", [])}


async def _listing(request: Request, who: Viewer, status: int = 200, **extra: Any) -> Response:
    teams = (await admin_teams_router.list_teams(_gateway(request)))["data"]
    context = _context(request, **{"form": {}, **extra})
    return page(request, "teams.html", who, status=status, teams=teams, **context)


@router.get("")
async def list_teams(request: Request, who: Viewer = Depends(admin_viewer)) -> Response:
    return await _listing(request, who)


@router.post("")
async def create_team(request: Request, who: Viewer = Depends(admin_viewer)) -> Response:
    form = await read_form(request)
    if not csrf_ok(who, one(form, "csrf")):
        return page(request, "denied.html", who, status=403, reason=EXPIRED)
    try:
        body = key_forms.team_create_body(form)
        made = await admin_teams_router.create_team(body, _gateway(request), console_actor(request, who))
    except APIError as exc:
        return await _listing(request, who, exc.status_code, error=error_text(exc), form=_sent_back(form))
    return RedirectResponse(f"/console/teams/{made['id']}?created=1", status_code=303)


async def _team_page(request: Request, who: Viewer, team: str, status: int = 200, **extra: Any) -> Response:
    gw = _gateway(request)
    record = await admin_teams_router.show_team(team, gw)
    keys = [k for k in (await admin_router.list_keys(gw))["data"] if k["team_id"] == record["id"]]
    return page(request, "team_edit.html", who, status=status, team=record, keys=keys, **_context(request, **extra))


@router.get("/{team}")
async def show_team(request: Request, team: str, who: Viewer = Depends(admin_viewer)) -> Response:
    try:
        return await _team_page(request, who, team)
    except APIError as exc:
        return page(request, "denied.html", who, status=exc.status_code, reason=error_text(exc))


@router.post("/{team}")
async def change_team(request: Request, team: str, who: Viewer = Depends(admin_viewer)) -> Response:
    form = await read_form(request)
    if not csrf_ok(who, one(form, "csrf")):
        return page(request, "denied.html", who, status=403, reason=EXPIRED)
    gw = _gateway(request)
    actor = console_actor(request, who)
    try:
        before = await admin_teams_router.show_team(team, gw)
        if one(form, "action") == "delete":
            await admin_teams_router.delete_team(team, gw, actor)
            return RedirectResponse("/console/teams?deleted=1", status_code=303)
        await admin_teams_router.update_team(team, key_forms.team_update_body(form, before), gw, actor)
    except APIError as exc:
        try:
            return await _team_page(request, who, team, status=exc.status_code, error=error_text(exc))
        except APIError:
            return page(request, "denied.html", who, status=exc.status_code, reason=error_text(exc))
    return RedirectResponse(f"/console/teams/{before['id']}?saved=1", status_code=303)
